import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import net from 'node:net'
import OpenAI, { toFile } from 'openai'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import { usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// POST /v1/completions (legacy), through the official openai SDK's client.completions: served on
// chat models by translation to chat, billed exactly as the same chat request.

const PRICE = {
  promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
  completionNano: parseRub(CHAT_PRICE.completion, 6)!,
}
const prompt = 'Write a line about rivers'

let t: Tropa
let eos: Tropa
beforeAll(async () => {
  t = await startTropa()
  // Every answer runs to its max_tokens: shows the bound Tropa sent.
  eos = await startTropa({ nodes: [{ name: 'eos', timeScale: 0, ignoreEos: true }] })
})
afterAll(async () => {
  await t.stop()
  await eos.stop()
})

const costOf = (u: unknown) => (u as { cost_rub: number }).cost_rub

describe('POST /v1/completions', () => {
  test('plain: a text_completion billed exactly as the same chat request', async () => {
    const { data, response } = await t
      .client()
      .completions.create({ model: 'test/chat', prompt, max_tokens: 12, seed: 4 })
      .withResponse()
    expect(data.object).toBe('text_completion')
    expect(data.id).toBe(`cmpl-${response.headers.get('x-request-id')}`)
    expect(data.model).toBe('test/chat')
    expect(data.choices).toHaveLength(1)
    expect(data.choices[0]!.index).toBe(0)
    expect(data.choices[0]!.logprobs).toBeNull()
    expect(data.choices[0]!.text.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(data.choices[0]!.finish_reason)
    const expected = costNano(data.usage!.prompt_tokens, data.usage!.completion_tokens, PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
    expect(costOf(data.usage)).toBe(nanoToRubNumber(expected))

    const { data: chat, response: chatResponse } = await t
      .client()
      .chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: prompt }],
        max_tokens: 12,
        seed: 4,
      })
      .withResponse()
    expect(chat.choices[0]!.message.content).toBe(data.choices[0]!.text)
    expect(chat.usage).toEqual(data.usage!)
    expect(chatResponse.headers.get('x-tropa-cost-rub')).toBe(response.headers.get('x-tropa-cost-rub'))
    const rows = await usageRows(t)
    const mine = rows.filter((r) => r.requestId === response.headers.get('x-request-id'))
    expect(mine).toHaveLength(1)
    expect(mine[0]!.costNano).toBe(expected)
  })

  test('max_tokens absent: the legacy default of 16', async () => {
    const c = await eos.client().completions.create({ model: 'test/chat', prompt })
    expect(c.usage!.completion_tokens).toBe(16)
    expect(c.choices[0]!.finish_reason).toBe('length')
  })

  test('a one-string prompt array is the string', async () => {
    const c = await eos.client().completions.create({ model: 'test/chat', prompt: [prompt], max_tokens: 5 })
    expect(c.usage!.completion_tokens).toBe(5)
    const s = await eos.client().completions.create({ model: 'test/chat', prompt, max_tokens: 5 })
    expect(c.usage!.prompt_tokens).toBe(s.usage!.prompt_tokens)
  })

  test('streamed with include_usage: text_completion chunks, a usage chunk with the chat stream’s cost, [DONE]', async () => {
    const { data: stream, response } = await t
      .client()
      .completions.create({
        model: 'test/chat',
        prompt,
        max_tokens: 20,
        seed: 9,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const chunks: OpenAI.Completion[] = []
    for await (const c of stream) chunks.push(c)
    const id = `cmpl-${response.headers.get('x-request-id')}`
    for (const c of chunks) {
      expect(c.id).toBe(id)
      expect(c.object).toBe('text_completion')
      expect(c.model).toBe('test/chat')
    }
    const text = chunks.map((c) => c.choices[0]?.text ?? '').join('')
    expect(text.length).toBeGreaterThan(0)
    expect(chunks.some((c) => c.choices[0]?.finish_reason != null)).toBe(true)
    const last = chunks.at(-1)!
    expect(last.choices).toEqual([])
    const usage = last.usage!
    const expected = costNano(usage.prompt_tokens, usage.completion_tokens, PRICE)
    expect(costOf(usage)).toBe(nanoToRubNumber(expected))

    const chat = await t.client().chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: prompt }],
      max_tokens: 20,
      seed: 9,
      stream: true,
      stream_options: { include_usage: true },
    })
    let chatText = ''
    let chatUsage: OpenAI.CompletionUsage | undefined
    for await (const c of chat) {
      chatText += c.choices[0]?.delta.content ?? ''
      chatUsage = c.usage ?? chatUsage
    }
    expect(text).toBe(chatText)
    expect(chatUsage).toEqual(usage)
  })

  test('streamed without include_usage: no usage chunk, still billed', async () => {
    const res = await t.fetch('/v1/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', prompt, max_tokens: 6, stream: true }),
    })
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toStartWith('text/event-stream')
    const events = (await res.text()).split('\n\n').filter(Boolean)
    expect(events.at(-1)).toBe('data: [DONE]')
    for (const e of events.slice(0, -1)) {
      const c = JSON.parse(e.slice(6)) as { object: string; usage?: unknown; choices: unknown[] }
      expect(c.object).toBe('text_completion')
      expect(c.usage).toBeUndefined()
      expect(c.choices).toHaveLength(1)
    }
    const rows = await usageRows(t)
    expect(rows.find((r) => r.requestId === res.headers.get('x-request-id'))?.outcome).toBe('ok')
  })
})

describe('POST /v1/completions: errors in OpenAI’s shape', () => {
  const refused: [string, Record<string, unknown>, string][] = [
    ['two prompts', { prompt: ['a', 'b'] }, 'prompt'],
    ['a token array', { prompt: [1, 2, 3] }, 'prompt'],
    ['arrays of token arrays', { prompt: [[1, 2]] }, 'prompt'],
    ['n > 1', { prompt, n: 2 }, 'n'],
    ['best_of > 1', { prompt, best_of: 3 }, 'best_of'],
    ['suffix', { prompt, suffix: 'end' }, 'suffix'],
    ['echo', { prompt, echo: true }, 'echo'],
    ['logprobs', { prompt, logprobs: 2 }, 'logprobs'],
    ['no prompt', {}, 'prompt'],
    ['a prompt that is an object', { prompt: { text: 'x' } }, 'prompt'],
  ]
  for (const [what, extra, param] of refused)
    test(`${what}: 400 naming ${param}, nothing billed`, async () => {
      const before = (await usageRows(t)).length
      const err = await t
        .client()
        .completions.create({
          model: 'test/chat',
          ...extra,
        } as unknown as OpenAI.CompletionCreateParamsNonStreaming)
        .catch((e: unknown) => e)
      expect(err).toBeInstanceOf(OpenAI.BadRequestError)
      const e = err as InstanceType<typeof OpenAI.BadRequestError>
      expect(e.status).toBe(400)
      expect(e.type).toBe('invalid_request_error')
      expect(e.param).toBe(param)
      expect(e.message.length).toBeGreaterThan(10)
      expect(await usageRows(t)).toHaveLength(before)
    })

  test('an unknown model is 404, an embedding model 400, no key 401', async () => {
    const unknown = await t
      .client()
      .completions.create({ model: 'test/nope', prompt })
      .catch((e: unknown) => e)
    expect(unknown).toBeInstanceOf(OpenAI.NotFoundError)
    const embed = await t
      .client()
      .completions.create({ model: 'test/embed', prompt })
      .catch((e: unknown) => e)
    expect(embed).toBeInstanceOf(OpenAI.BadRequestError)
    const anon = await t
      .client('sk-wrong')
      .completions.create({ model: 'test/chat', prompt })
      .catch((e: unknown) => e)
    expect(anon).toBeInstanceOf(OpenAI.AuthenticationError)
  })

  test('a prompt past the context: 400 context_length_exceeded', async () => {
    const err = await t
      .client()
      .completions.create({ model: 'test/chat', prompt: 'word '.repeat(5000), max_tokens: 5 })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('context_length_exceeded')
  })
})

describe('POST /v1/completions: a client that leaves mid-stream', () => {
  test('the upstream is cancelled through the translation and the client pays for what it was sent', async () => {
    const slow = await startTropa({ nodes: [{ name: 'slow', itlMs: 20, timeScale: 1 }] })
    try {
      const controller = new AbortController()
      const res = await slow.fetch('/v1/completions', {
        method: 'POST',
        body: JSON.stringify({ model: 'test/chat', prompt, max_tokens: 60, stream: true }),
        signal: controller.signal,
      })
      const reader = res.body!.getReader()
      let received = ''
      while (received.split('"text":"').length < 4) {
        const { value } = await reader.read()
        received += new TextDecoder().decode(value)
      }
      controller.abort()
      await Bun.sleep(300)
      expect(slow.nodes[0]!.stats().aborted).toBe(1)
      const rows = await usageRows(slow)
      expect(rows).toHaveLength(1)
      expect(rows[0]!.outcome).toBe('client_disconnected')
      expect(rows[0]!.completionTokens).toBeGreaterThan(0)
      expect(rows[0]!.completionTokens).toBeLessThan(60)
      expect([...slow.svc.deps.pool.nodes.values()][0]!.inFlight).toBe(0)
    } finally {
      await slow.stop()
    }
  })
})

describe('/v1/completions lines in a batch', () => {
  const jsonl = (rows: unknown[]) => `${rows.map((r) => JSON.stringify(r)).join('\n')}\n`
  const line = (i: number, body: Record<string, unknown> = {}) => ({
    custom_id: `c-${i}`,
    method: 'POST',
    url: '/v1/completions',
    body: { model: 'test/chat', prompt: `completion number ${i}`, max_tokens: 10, seed: i, ...body },
  })
  async function runBatch(rows: unknown[]) {
    const client = t.client()
    const file = await client.files.create({
      file: await toFile(Buffer.from(jsonl(rows)), 'c.jsonl'),
      purpose: 'batch',
    })
    const created = await client.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/completions',
      completion_window: '24h',
    })
    const until = Date.now() + 20_000
    for (;;) {
      const b = await client.batches.retrieve(created.id)
      if (['completed', 'failed', 'expired', 'cancelled'].includes(b.status)) return b
      if (Date.now() > until) throw new Error(`batch stuck in ${b.status}`)
      await Bun.sleep(50)
    }
  }

  test('text_completion results at exactly half the live price', async () => {
    const rows = Array.from({ length: 10 }, (_, i) => line(i))
    const b = await runBatch(rows)
    expect(b.status).toBe('completed')
    expect(b.request_counts).toEqual({ total: 10, completed: 10, failed: 0 })
    const out = (await (await t.client().files.content(b.output_file_id!)).text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
    expect(out).toHaveLength(10)
    await t.svc.ledger.flush()
    const all = await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)
    for (const o of out) {
      expect(o.error).toBeNull()
      const body = o.response.body as OpenAI.Completion
      expect(body.object).toBe('text_completion')
      expect(body.id).toStartWith('cmpl-')
      expect(body.model).toBe('test/chat')
      expect(body.choices[0]!.text.length).toBeGreaterThan(0)
      const i = Number((o.custom_id as string).slice(2))
      // The same request live: the same answer, twice the price.
      const { data, response } = await t
        .client()
        .completions.create(rows[i]!.body as unknown as OpenAI.CompletionCreateParamsNonStreaming)
        .withResponse()
      expect(data.choices[0]!.text).toBe(body.choices[0]!.text)
      await t.svc.ledger.flush()
      const rowsNow = await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)
      const live = rowsNow.find((r) => r.requestId === response.headers.get('x-request-id'))!
      const batched = all.find((r) => r.batchId === b.id && r.requestId === o.response.request_id)!
      expect(batched.costNano * 2n).toBe(live.costNano)
    }
  }, 30_000)

  test('a line the translation cannot carry fails validation with its param', async () => {
    const b = await runBatch([line(1), line(2, { prompt: ['a', 'b'] }), line(3, { echo: true })])
    expect(b.status).toBe('failed')
    expect((b.errors?.data ?? []).map((e) => [e.line, e.code, e.param])).toEqual([
      [2, 'invalid_value', 'body.prompt'],
      [3, 'invalid_value', 'body.echo'],
    ])
  })
})

describe('POST /v1/completions: a client that stops reading', () => {
  test('backpressure holds through the translation: the stream is cut and billed for what was relayed', async () => {
    const LONG = 150_000
    const fast = await startTropa({
      nodes: [
        {
          name: 'fast',
          ignoreEos: true,
          itlMs: 0.1,
          iterationOverheadMs: 0,
          decodeMsPerSeq: 0,
          prefillTokensPerSec: 10_000_000,
        },
      ],
      models: (nodes) => [
        {
          id: 'test/long',
          context_length: 200_000,
          pricing: CHAT_PRICE,
          routes: nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'chat-up' })),
        },
      ],
    })
    // server.stream_write_timeout_ms, shortened for the test
    ;(fast.svc.deps as { streamWriteTimeoutMs: number }).streamWriteTimeoutMs = 1000
    try {
      const body = JSON.stringify({
        model: 'test/long',
        prompt: 'tell me everything',
        stream: true,
        max_tokens: LONG,
      })
      const socket = net.connect(Number(new URL(fast.url).port), '127.0.0.1')
      socket.write(
        `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${fast.apiKey}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      )
      socket.pause() // reads nothing
      let row: Awaited<ReturnType<typeof usageRows>>[number] | undefined
      const until = Date.now() + 30_000
      while (!row && Date.now() < until) {
        await Bun.sleep(200)
        row = (await usageRows(fast))[0]
      }
      socket.destroy()
      expect(row?.outcome).toBe('client_stalled')
      expect(row!.completionTokens).toBeGreaterThan(0)
      expect(row!.completionTokens).toBeLessThan(LONG)
      expect(fast.nodes[0]!.stats().aborted).toBe(1)
    } finally {
      await fast.stop()
    }
  }, 40_000)
})
