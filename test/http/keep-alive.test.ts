import { afterEach, describe, expect, test } from 'bun:test'
import type { Socket, TCPSocketListener } from 'bun'
import OpenAI, { type APIError } from 'openai'
import { costNano, rubNumberToNano } from '../../src/billing/money.ts'
import { renderPrompt } from '../../src/simulator/render.ts'
import { loadTokenizer } from '../../src/tokenizer.ts'
import { usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// SSE keep-alive: a stream with no first token by server.sse_keep_alive_ms gets its headers and
// `: keep-alive` comments, so a load balancer's idle timeout does not cut the wait; failover goes
// on behind them, and a failure after that point is one error event.

let t: Tropa | undefined
let proxy: IdleCuttingProxy | undefined
afterEach(async () => {
  proxy?.stop()
  proxy = undefined
  await t?.stop()
  t = undefined
})

const messages = [{ role: 'user' as const, content: 'Tell me a long story about a lighthouse keeper.' }]
const PRICE = {
  promptNano: rubNumberToNano(Number(CHAT_PRICE.prompt))!,
  completionNano: rubNumberToNano(Number(CHAT_PRICE.completion))!,
}

interface IdleCuttingProxy {
  readonly port: number
  /** Connections closed for being idle. */
  cuts: number
  stop(): void
}

/**
 * A TCP proxy that closes a connection when no byte went either way for `idleMs`, as a load
 * balancer's idle timeout does.
 */
function idleCuttingProxy(targetPort: number, idleMs: number): IdleCuttingProxy {
  interface Conn {
    upstream: Socket<Conn> | undefined
    client: Socket<Conn>
    pending: Uint8Array[]
    lastMs: number
    closed: boolean
  }
  const conns = new Set<Conn>()
  const state = { cuts: 0 }
  const close = (c: Conn) => {
    if (c.closed) return
    c.closed = true
    conns.delete(c)
    c.client.end()
    c.upstream?.end()
  }
  const listener: TCPSocketListener<Conn> = Bun.listen<Conn>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(client) {
        const c: Conn = { upstream: undefined, client, pending: [], lastMs: Date.now(), closed: false }
        client.data = c
        conns.add(c)
        void Bun.connect<Conn>({
          hostname: '127.0.0.1',
          port: targetPort,
          data: c,
          socket: {
            open(up) {
              c.upstream = up
              for (const p of c.pending) up.write(p)
              c.pending = []
            },
            data(_up, chunk) {
              c.lastMs = Date.now()
              c.client.write(chunk)
            },
            close: () => close(c),
            error: () => close(c),
          },
        }).catch(() => close(c))
      },
      data(client, chunk) {
        const c = client.data
        c.lastMs = Date.now()
        if (c.upstream) c.upstream.write(chunk)
        else c.pending.push(new Uint8Array(chunk))
      },
      close: (client) => close(client.data),
      error: (client) => close(client.data),
    },
  })
  const sweep = setInterval(() => {
    const now = Date.now()
    for (const c of conns)
      if (now - c.lastMs >= idleMs) {
        state.cuts++
        close(c)
      }
  }, 100)
  return {
    port: listener.port,
    get cuts() {
      return state.cuts
    },
    stop() {
      clearInterval(sweep)
      for (const c of conns) close(c)
      listener.stop(true)
    },
  }
}

/** The raw SSE text of a stream, read to its end. */
async function readAll(res: Response, onText?: (text: string) => void): Promise<string> {
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let text = ''
  for (;;) {
    const { done, value } = await reader.read()
    if (done) return text
    text += decoder.decode(value, { stream: true })
    onText?.(text)
  }
}

describe('a first token later than a proxy idle timeout', () => {
  test('20 s to the first token reaches the client through a proxy that cuts idle connections at 10 s', async () => {
    await loadTokenizer()
    // The simulated node prefills this prompt in 20 s, then streams at once.
    const promptCount = renderPrompt(messages).count
    t = await startTropa({
      nodes: [
        {
          name: 'slow',
          timeScale: 1,
          prefillTokensPerSec: promptCount / 20,
          prefillBudgetTokens: 2,
          itlMs: 2,
          seed: 1,
        },
      ],
      upstream: { first_byte_timeout_ms: 60_000 },
      server: { sse_keep_alive_ms: 4000 },
      extra: { routing: { hedge_share: 0 } },
    })
    const tropaPort = Number(new URL(t.url).port)
    proxy = idleCuttingProxy(tropaPort, 10_000)
    const client = new OpenAI({
      baseURL: `http://127.0.0.1:${proxy.port}/v1`,
      apiKey: t.apiKey,
      maxRetries: 0,
      timeout: 60_000,
    })

    // The control: with keep-alive off, the proxy cuts the silent wait (else this test proves nothing).
    ;(t.svc.deps as { sseKeepAliveMs: number }).sseKeepAliveMs = 0
    const cut = client.chat.completions
      .create({ model: 'test/chat', messages, stream: true, max_tokens: 16 })
      .then(async (s) => {
        for await (const _ of s);
      })
    expect(cut).rejects.toBeInstanceOf(OpenAI.APIConnectionError)
    await cut.catch(() => {})
    expect(proxy.cuts).toBe(1)
    // Tropa saw the client go: nothing billed, nothing held.
    await Bun.sleep(200)
    expect(await usageRows(t)).toHaveLength(0)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)

    ;(t.svc.deps as { sseKeepAliveMs: number }).sseKeepAliveMs = 4000
    const before = t.svc.identity.org(t.orgId).balanceNano
    const startedMs = Date.now()
    const stream = await client.chat.completions.create({
      model: 'test/chat',
      messages,
      stream: true,
      max_tokens: 16,
      stream_options: { include_usage: true },
    })
    let text = ''
    let firstTokenMs = 0
    let usage: (OpenAI.CompletionUsage & { cost_rub?: number }) | undefined
    let finish: string | null = null
    for await (const chunk of stream) {
      const piece = chunk.choices[0]?.delta.content ?? ''
      if (piece && !firstTokenMs) firstTokenMs = Date.now() - startedMs
      text += piece
      finish = chunk.choices[0]?.finish_reason ?? finish
      if (chunk.usage) usage = chunk.usage
    }
    expect(firstTokenMs).toBeGreaterThan(15_000)
    expect(text.length).toBeGreaterThan(0)
    expect(finish).toBe('length')
    expect(proxy.cuts).toBe(1)
    // Billing is as exact as without keep-alive: the row's cost is the usage at the price.
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    const row = rows[0]!
    expect(row.outcome).toBe('ok')
    expect(row.promptTokens).toBe(usage!.prompt_tokens)
    expect(row.completionTokens).toBe(usage!.completion_tokens)
    expect(row.completionTokens).toBe(16)
    expect(row.costNano).toBe(costNano(row.promptTokens, row.completionTokens, PRICE))
    expect(rubNumberToNano(usage!.cost_rub!)).toBe(row.costNano)
    expect(t.svc.identity.org(t.orgId).balanceNano).toBe(before - row.costNano)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
  }, 60_000)
})

describe('after the keep-alive began', () => {
  const twoHungNodes = () =>
    startTropa({
      nodes: ['a', 'b'].map((name, i) => ({ name, timeScale: 0, seed: i + 1, faults: { hang: true } })),
      upstream: { first_byte_timeout_ms: 2000, max_attempts: 2 },
      server: { sse_keep_alive_ms: 300 },
      extra: { routing: { hedge_share: 0, health_check_ms: 0 } },
    })
  const request = (tropa: Tropa, init: RequestInit = {}) =>
    tropa.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', messages, stream: true, max_tokens: 8 }),
      ...init,
    })

  test('a node that times out is failed over: the client gets comments, then the other node answers in full', async () => {
    t = await twoHungNodes()
    const tropa = t
    const res = await request(tropa)
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    // Headers went out before any node answered: the node is not named.
    expect(res.headers.get('x-tropa-node')).toBeNull()
    let healed = false
    const text = await readAll(res, (sofar) => {
      // The first attempt hangs on; the node it fails over to answers.
      if (!healed && sofar.startsWith(': keep-alive\n\n')) {
        healed = true
        for (const n of tropa.nodes) n.setFaults({ hang: false })
      }
    })
    expect(healed).toBe(true)
    const events = text.split('\n\n').filter(Boolean)
    const comments = events.filter((e) => e === ': keep-alive')
    // 300 ms apart over the 2 s the first attempt took (the watchdog ticks each 100 ms).
    expect(comments.length).toBeGreaterThanOrEqual(3)
    expect(events.some((e) => e.includes('"error"'))).toBe(false)
    expect(events.at(-1)).toBe('data: [DONE]')
    const content = events.filter((e) => e.includes('"content":"')).length
    expect(content).toBeGreaterThan(0)
    // Both nodes were asked; the first was cut at its deadline and judged failed.
    expect(tropa.nodes.map((n) => n.stats().chatRequests).sort()).toEqual([0, 1])
    expect(tropa.nodes.reduce((s, n) => s + n.stats().requests, 0)).toBe(2)
    expect(tropa.nodes.reduce((s, n) => s + n.stats().aborted, 0)).toBe(1)
    const rows = await usageRows(tropa)
    expect(rows).toHaveLength(1)
    expect(rows[0]!.outcome).toBe('ok')
    expect(rows[0]!.costNano).toBe(costNano(rows[0]!.promptTokens, rows[0]!.completionTokens, PRICE))
    expect(tropa.svc.identity.org(tropa.orgId).reservedNano).toBe(0n)
    expect([...tropa.svc.deps.pool.nodes.values()].map((n) => n.inFlight)).toEqual([0, 0])
  }, 20_000)

  test('every node failing ends the stream with one error event the SDK raises; nothing is billed', async () => {
    t = await twoHungNodes()
    const before = t.svc.identity.org(t.orgId).balanceNano
    const stream = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages, stream: true, max_tokens: 8 })
    let error: unknown
    try {
      for await (const _ of stream);
    } catch (err) {
      error = err
    }
    expect(error).toBeInstanceOf(OpenAI.APIError)
    expect((error as APIError).code).toMatch(/^upstream_/)
    expect(t.nodes.reduce((s, n) => s + n.stats().requests, 0)).toBe(2)
    expect(await usageRows(t)).toHaveLength(0)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
    expect(t.svc.identity.org(t.orgId).balanceNano).toBe(before)
  }, 20_000)

  test('a client that leaves during the keep-alive stops the attempt and is charged nothing', async () => {
    t = await twoHungNodes()
    const controller = new AbortController()
    const res = await request(t, { signal: controller.signal })
    const reader = res.body!.getReader()
    const { value } = await reader.read()
    expect(new TextDecoder().decode(value)).toBe(': keep-alive\n\n')
    controller.abort()
    await Bun.sleep(300)
    expect(t.nodes.reduce((s, n) => s + n.stats().aborted, 0)).toBe(1)
    expect(await usageRows(t)).toHaveLength(0)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
    expect([...t.svc.deps.pool.nodes.values()].map((n) => n.inFlight)).toEqual([0, 0])
  }, 20_000)

  test('the Messages and Responses APIs keep alive too: pings, then the answer', async () => {
    t = await twoHungNodes()
    const tropa = t
    const heal = (sofar: string) => {
      if (sofar.length > 0) for (const n of tropa.nodes) n.setFaults({ hang: false })
    }
    const messages = await tropa.fetch('/v1/messages', {
      method: 'POST',
      headers: { 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({
        model: 'test/chat',
        max_tokens: 8,
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
      }),
    })
    expect(messages.status).toBe(200)
    const text = await readAll(messages, heal)
    // The opening ping, then one for each keep-alive comment over the 2 s the first node took.
    expect(text.split('event: ping\n').length - 1).toBeGreaterThanOrEqual(3)
    expect(text).toContain('event: content_block_delta')
    expect(text.trimEnd().endsWith('data: {"type":"message_stop"}')).toBe(true)

    for (const n of tropa.nodes) n.setFaults({ hang: true })
    const responses = await tropa.fetch('/v1/responses', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', input: 'hi', max_output_tokens: 8, stream: true }),
    })
    expect(responses.status).toBe(200)
    const events = (await readAll(responses, heal)).split('\n\n').filter(Boolean)
    // response.created first, then the comments while no node has answered.
    expect(events.filter((e) => e === ': keep-alive').length).toBeGreaterThanOrEqual(2)
    // The answer in full (it runs to max_output_tokens).
    expect(events.some((e) => e.startsWith('event: response.incomplete'))).toBe(true)
    expect(events.filter((e) => e.startsWith('event: response.output_text.delta')).length).toBe(8)
  }, 20_000)

  test('a first token before the keep-alive time: the stream is as before, its node named', async () => {
    t = await startTropa({ server: { sse_keep_alive_ms: 5000 } })
    const res = await request(t)
    expect(res.headers.get('x-tropa-node')).toMatch(/^sim-/)
    const text = await readAll(res)
    expect(text).not.toContain(': keep-alive')
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true)
  })
})
