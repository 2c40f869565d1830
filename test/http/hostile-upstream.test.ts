import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { connect } from 'node:net'
import OpenAI, { toFile } from 'openai'
import { rubNumberToNano } from '../../src/billing/money.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// An upstream that lies or misbehaves: its usage is untrusted input, and none of this may cost
// money that was not earned, crash the router, or leak a reservation.
let mode = 'negative'
const UPSTREAM_SECRET = 'sk-upstream-0123456789abcdefXYZ'
const logs: { level: string; msg: string; fields?: Record<string, unknown> }[] = []
const hostile = Bun.serve({
  port: 0,
  hostname: '127.0.0.1',
  async fetch(req) {
    // Tropa's probes (GET /metrics, /v1/models) find nothing: the node is judged by its answers.
    if (req.method !== 'POST') return new Response('not found', { status: 404 })
    const body = (await req.json()) as { stream?: boolean }
    const chunk = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`
    const base = { id: 'up', object: 'chat.completion.chunk', created: 1, model: 'm' }
    if (new URL(req.url).pathname.endsWith('/embeddings'))
      return new Response(
        `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.6,0.8]}],"model":"m","usage":${
          mode === 'negative'
            ? '{"prompt_tokens":-3,"total_tokens":"abc"}'
            : mode === 'text'
              ? '"lots"'
              : 'null'
        }}`,
        { headers: { 'content-type': 'application/json' } },
      )
    if (mode === 'reject')
      return Response.json(
        {
          error: {
            message: `Invalid request: key ${UPSTREAM_SECRET} cannot read /srv/tropa/models/config.json (Bearer ${UPSTREAM_SECRET})`,
            type: 'invalid_request_error',
            param: 'messages',
          },
        },
        { status: 422 },
      )
    if (mode === 'error-first')
      return new Response(chunk({ error: { message: 'boom' } }), {
        headers: { 'content-type': 'text/event-stream' },
      })
    if (body.stream && (mode === 'stream-garbage' || mode === 'stream-none')) {
      let text = ''
      for (let i = 1; i <= 5; i++)
        text += chunk({ ...base, choices: [{ index: 0, delta: { content: ' word' }, finish_reason: null }] })
      if (mode === 'stream-garbage')
        text += chunk({ ...base, choices: [], usage: { prompt_tokens: -5, completion_tokens: 'many' } })
      return new Response(`${text}data: [DONE]\n\n`, { headers: { 'content-type': 'text/event-stream' } })
    }
    if (body.stream) {
      // cumulative usage on every chunk, as vLLM's continuous_usage_stats does
      let text = ''
      for (let i = 1; i <= 5; i++)
        text += chunk({
          ...base,
          choices: [{ index: 0, delta: { content: ' word' }, finish_reason: null }],
          usage: { prompt_tokens: 10, completion_tokens: i, total_tokens: 10 + i },
        })
      text += chunk({
        ...base,
        choices: [],
        usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
      })
      return new Response(`${text}data: [DONE]\n\n`, { headers: { 'content-type': 'text/event-stream' } })
    }
    const usage =
      mode === 'negative'
        ? { prompt_tokens: 10, completion_tokens: -1_000_000, total_tokens: 0 }
        : { prompt_tokens: 'abc', completion_tokens: 1.5, total_tokens: 2 }
    return Response.json({
      id: 'up',
      object: 'chat.completion',
      created: 1,
      model: 'm',
      choices: [{ index: 0, message: { role: 'assistant', content: 'hello there' }, finish_reason: 'stop' }],
      usage,
    })
  },
})

let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    log: (level, msg, fields) => {
      logs.push({ level, msg, ...(fields && { fields }) })
    },
    models: (nodes) => [
      {
        id: 'test/chat',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: [{ name: 'hostile', base_url: `http://127.0.0.1:${hostile.port}/v1` }],
      },
      {
        id: 'test/embed',
        kind: 'embedding',
        context_length: 4096,
        dimensions: 2,
        pricing: { prompt: '0.000002', completion: '0.000000' },
        routes: [{ name: 'hostile', base_url: `http://127.0.0.1:${hostile.port}/v1` }],
      },
      {
        id: 'test/good',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: [{ name: nodes[0]!.name, base_url: nodes[0]!.url }],
      },
      {
        id: 'test/failover',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: [
          { name: 'hostile', base_url: `http://127.0.0.1:${hostile.port}/v1` },
          { name: nodes[0]!.name, base_url: nodes[0]!.url },
        ],
      },
    ],
  })
})
afterAll(async () => {
  await t.stop()
  hostile.stop(true)
})

const ask = (model: string, extra: Record<string, unknown> = {}) =>
  t.fetch('/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 50, ...extra }),
  })

async function usageRows() {
  await t.svc.ledger.flush()
  return (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter((r) => r.kind === 'usage')
}

describe('a hostile upstream', () => {
  test('negative or nonsense token counts are not billed as reported: Tropa counts itself', async () => {
    for (const m of ['negative', 'garbage']) {
      mode = m
      const res = await ask('test/chat')
      expect(res.status).toBe(200)
      await res.arrayBuffer()
    }
    const rows = await usageRows()
    expect(rows).toHaveLength(2)
    for (const r of rows) {
      expect(r.costNano).toBeGreaterThan(0n)
      expect(r.estimated).toBe(true)
      expect(r.completionTokens).toBe(2) // " hello there" counted
    }
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
  })

  test('cumulative usage on every chunk is billed on the final figure, not the first', async () => {
    mode = 'stream'
    const before = (await usageRows()).length
    const res = await ask('test/chat', {
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    })
    const text = await res.text()
    const rows = await usageRows()
    expect(rows).toHaveLength(before + 1)
    expect(rows.at(-1)!.completionTokens).toBe(5)
    expect(text.split('"cost_rub"').length - 1).toBe(1)
  })

  test('an error as the first stream event fails over to the next node, unbilled', async () => {
    mode = 'error-first'
    const before = (await usageRows()).length
    const res = await ask('test/failover', { stream: true })
    const text = await res.text()
    expect(res.status).toBe(200)
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true)
    expect(res.headers.get('x-tropa-node')).toBe(t.nodes[0]!.name)
    const rows = await usageRows()
    expect(rows).toHaveLength(before + 1)
    expect(rows.at(-1)!.node).toBe(t.nodes[0]!.name)
  })

  test('usage the upstream got wrong reaches the client as billed: estimated, with its cost', async () => {
    for (const m of ['negative', 'garbage']) {
      mode = m
      const res = await t.client().chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 50,
      })
      const usage = res.usage as unknown as Record<string, unknown>
      const row = (await usageRows()).at(-1)!
      expect(usage).toMatchObject({
        prompt_tokens: row.promptTokens,
        completion_tokens: 2,
        total_tokens: row.promptTokens + 2,
        estimated: true,
      })
      expect(row.estimated).toBe(true)
      expect(rubNumberToNano(usage.cost_rub as number)).toBe(row.costNano)
    }
  })

  for (const m of ['stream-garbage', 'stream-none'])
    test(`streamed, ${m === 'stream-garbage' ? 'a final usage event with garbage' : 'no usage event'}: the usage chunk shows the billed, estimated usage`, async () => {
      mode = m
      const stream = await t.client().chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 50,
        stream: true,
        stream_options: { include_usage: true },
      })
      const usages: Record<string, unknown>[] = []
      let text = ''
      for await (const c of stream) {
        text += c.choices[0]?.delta.content ?? ''
        if (c.usage) usages.push(c.usage as unknown as Record<string, unknown>)
      }
      expect(text).toBe(' word word word word word')
      expect(usages).toHaveLength(1)
      const row = (await usageRows()).at(-1)!
      expect(row.estimated).toBe(true)
      expect(row.completionTokens).toBe(5)
      expect(usages[0]).toMatchObject({
        prompt_tokens: row.promptTokens,
        completion_tokens: 5,
        estimated: true,
      })
      expect(rubNumberToNano(usages[0]!.cost_rub as number)).toBe(row.costNano)
      expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
    })

  test('embeddings with negative, text or null usage: the client sees the billed, estimated usage', async () => {
    for (const m of ['negative', 'text', 'null']) {
      mode = m
      const res = await t.fetch('/v1/embeddings', {
        method: 'POST',
        body: JSON.stringify({ model: 'test/embed', input: 'hello there world' }),
      })
      expect(res.status).toBe(200)
      const body = (await res.json()) as { data: unknown[]; usage: Record<string, unknown> }
      const row = (await usageRows()).at(-1)!
      expect(row.estimated).toBe(true)
      expect(row.promptTokens).toBe(3)
      expect(body.data).toHaveLength(1)
      expect(body.usage).toEqual({
        prompt_tokens: 3,
        total_tokens: 3,
        estimated: true,
        cost_rub: Number(res.headers.get('x-tropa-cost-rub')),
      })
      expect(rubNumberToNano(body.usage.cost_rub as number)).toBe(row.costNano)
    }
    // and the SDK reads it
    mode = 'negative'
    const r = await t
      .client()
      .embeddings.create({ model: 'test/embed', input: 'hello', encoding_format: 'float' })
    expect(r.usage.prompt_tokens).toBe(1)
  })

  test("an upstream's 4xx message reaches the client without its credentials and paths; the log has it", async () => {
    mode = 'reject'
    const before = (await usageRows()).length
    const err = await t
      .client()
      .chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 5,
      })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.UnprocessableEntityError)
    const e = err as InstanceType<typeof OpenAI.APIError>
    expect(e.status).toBe(422)
    expect(e.code).toBe('upstream_rejected')
    expect(e.param).toBe('messages')
    expect(e.type).toBe('invalid_request_error')
    expect(e.message).toContain('upstream rejected the request: Invalid request')
    expect(e.message).not.toContain('sk-')
    expect(e.message).not.toContain('/srv')
    expect(e.message).not.toContain(UPSTREAM_SECRET.slice(3))
    expect(JSON.stringify(e.error)).not.toContain('/srv')
    expect((e.error as { message: string }).message.length).toBeLessThanOrEqual(400)
    // the operator's log has the original
    const line = logs.find((l) => l.msg === 'upstream rejected the request')!
    expect(line.fields).toMatchObject({ node: 'hostile', status: 422 })
    expect(String(line.fields!.upstreamMessage)).toContain(UPSTREAM_SECRET)
    expect(String(line.fields!.upstreamMessage)).toContain('/srv/tropa/models/config.json')
    // not billed, nothing held
    expect((await usageRows()).length).toBe(before)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
  })

  test('batch lines: garbage usage shows as the billed estimate; a rejection is cleaned', async () => {
    const run = async (
      endpoint: '/v1/chat/completions' | '/v1/embeddings',
      body: Record<string, unknown>,
    ) => {
      const c = t.client()
      const line = JSON.stringify({ custom_id: 'l1', method: 'POST', url: endpoint, body })
      const file = await c.files.create({
        file: await toFile(Buffer.from(`${line}\n`), 'b.jsonl'),
        purpose: 'batch',
      })
      let b = await c.batches.create({ input_file_id: file.id, endpoint, completion_window: '24h' })
      for (let i = 0; i < 400 && !['completed', 'failed'].includes(b.status); i++) {
        await Bun.sleep(25)
        b = await c.batches.retrieve(b.id)
      }
      const id = b.output_file_id ?? b.error_file_id
      return JSON.parse((await (await c.files.content(id!)).text()).trim()) as {
        response: {
          status_code: number
          body: { usage?: Record<string, unknown>; error?: Record<string, unknown> }
        }
      }
    }
    mode = 'negative'
    const chat = await run('/v1/chat/completions', {
      model: 'test/chat',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 50,
    })
    expect(chat.response.body.usage).toMatchObject({ completion_tokens: 2, estimated: true })
    const emb = await run('/v1/embeddings', { model: 'test/embed', input: 'hello there world' })
    expect(emb.response.body.usage).toEqual({ prompt_tokens: 3, total_tokens: 3, estimated: true })
    mode = 'reject'
    const rejected = await run('/v1/chat/completions', {
      model: 'test/chat',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 5,
    })
    expect(rejected.response.status_code).toBe(422)
    const text = JSON.stringify(rejected)
    expect(text).toContain('Invalid request')
    expect(text).not.toContain('sk-')
    expect(text).not.toContain('/srv')
  }, 30_000)

  test('a client that drops an upload mid-way does not take the router down', async () => {
    const u = new URL(t.url)
    await new Promise<void>((resolve) => {
      const s = connect(Number(u.port), u.hostname, () => {
        s.write(
          `POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t.apiKey}\r\nContent-Type: multipart/form-data; boundary=B\r\nContent-Length: 100000\r\n\r\n--B\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n{"a":1}\n`,
          () =>
            setTimeout(() => {
              s.destroy()
              resolve()
            }, 50),
        )
      })
    })
    await Bun.sleep(100)
    expect((await t.fetch('/health')).status).toBe(200)
    expect((await ask('test/good')).status).toBe(200)
  })
})
