import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { CHAT_PRICE, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

/** The value of one series of the exposition (exact label set), or 0 when it is not there. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number {
  const want = Object.entries(labels)
    .map(([k, v]) => `${k}="${v}"`)
    .sort()
    .join(',')
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue
    const m = /^([a-z_]+)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (!m || m[1] !== name) continue
    const got = (m[2] ?? '')
      .split(/,(?=[a-z_]+=")/)
      .filter((s) => s.length > 0)
      .sort()
      .join(',')
    if (got === want) return Number(m[3])
  }
  return 0
}

const metrics = async (t: Tropa) => (await fetch(`${t.url}/metrics`)).text()
const CHAT = '/v1/chat/completions'
const messages = [{ role: 'user' as const, content: 'Tell me about the weather in Kazan today.' }]

/** Polls until `check` passes (metrics of a stream land when the stream's end is told). */
async function eventually(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 300; i++) {
    if (await check()) return
    await Bun.sleep(10)
  }
  throw new Error('condition not met in 3 s')
}

describe('request metrics and headers', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({
      nodes: [
        { name: 'sim-1', timeScale: 0, seed: 1 },
        { name: 'sim-2', timeScale: 0, seed: 2 },
        { name: 'slow', timeScale: 1, itlMs: 5, ignoreEos: true, seed: 3 },
        { name: 'broken', timeScale: 0, faults: { errorRate: 1 } },
      ],
      models: ([a, b, slow, broken]) => [
        {
          id: 'test/chat',
          context_length: 4096,
          pricing: CHAT_PRICE,
          routes: [a!, b!].map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'chat-up' })),
        },
        {
          id: 'test/slow',
          context_length: 4096,
          pricing: CHAT_PRICE,
          routes: [{ name: 'slow', base_url: slow!.url, upstream_model: 'chat-up' }],
        },
        {
          id: 'test/broken',
          context_length: 4096,
          pricing: CHAT_PRICE,
          routes: [{ name: 'broken', base_url: broken!.url, upstream_model: 'chat-up' }],
        },
        {
          id: 'test/embed',
          kind: 'embedding',
          context_length: 2048,
          dimensions: 256,
          pricing: { prompt: '0.000002', completion: '0.000000' },
          routes: [{ name: 'sim-1', base_url: a!.url, upstream_model: 'embed-up' }],
        },
      ],
    })
  })
  afterAll(() => t.stop())

  const ok = { endpoint: CHAT, model: 'test/chat', outcome: 'ok' }

  test('an answered request moves the request, duration, first-token, token and rouble series', async () => {
    const before = await metrics(t)
    const started = performance.now()
    const { data, response } = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages, max_tokens: 20 })
      .withResponse()
    const totalMs = performance.now() - started
    const after = await metrics(t)
    const node = response.headers.get('x-tropa-node')!
    const usage = data.usage as OpenAI.CompletionUsage & { cost_rub: number }

    expect(sample(after, 'tropa_requests_total', ok) - sample(before, 'tropa_requests_total', ok)).toBe(1)
    const dur = { endpoint: CHAT, model: 'test/chat', status: '2xx' }
    expect(
      sample(after, 'tropa_request_duration_seconds_count', dur) -
        sample(before, 'tropa_request_duration_seconds_count', dur),
    ).toBe(1)
    const ttft = { model: 'test/chat', node }
    expect(
      sample(after, 'tropa_time_to_first_token_seconds_count', ttft) -
        sample(before, 'tropa_time_to_first_token_seconds_count', ttft),
    ).toBe(1)
    const tokens = (type: string, text: string) =>
      sample(text, 'tropa_tokens_total', { model: 'test/chat', type })
    expect(tokens('prompt', after) - tokens('prompt', before)).toBe(usage.prompt_tokens)
    expect(tokens('completion', after) - tokens('completion', before)).toBe(usage.completion_tokens)
    const rub = (text: string) => sample(text, 'tropa_billed_rub_total', { model: 'test/chat' })
    expect(rub(after) - rub(before)).toBeCloseTo(usage.cost_rub, 9)
    const overhead = { endpoint: CHAT }
    expect(
      sample(after, 'tropa_router_overhead_seconds_count', overhead) -
        sample(before, 'tropa_router_overhead_seconds_count', overhead),
    ).toBe(1)

    // The router's own time: a number, not above what the client waited in all.
    const header = response.headers.get('x-tropa-overhead-ms')
    expect(header).toMatch(/^\d+(\.\d+)?$/)
    expect(Number(header)).toBeLessThan(totalMs)
    expect(response.headers.get('x-tropa-explain')).toBeNull()
  })

  test('x-tropa-explain: 1 says why the node was chosen', async () => {
    const res = await t.fetch(CHAT, {
      method: 'POST',
      headers: { 'x-tropa-explain': '1' },
      body: JSON.stringify({ model: 'test/chat', messages, max_tokens: 5 }),
    })
    expect(res.status).toBe(200)
    const explain = res.headers.get('x-tropa-explain')!
    expect(explain).toContain(`node=${res.headers.get('x-tropa-node')}`)
    expect(explain).toContain('policy=predicted-ttft')
    expect(explain).toMatch(/predicted_ttft_ms=\d/)
    expect(explain).toContain('prefix_cached_tokens=')
    expect(explain).toContain('attempts=1')
    expect(explain).toContain('hedged=false')
    // Any other value is not a request for it.
    const plain = await t.fetch(CHAT, {
      method: 'POST',
      headers: { 'x-tropa-explain': 'yes' },
      body: JSON.stringify({ model: 'test/chat', messages, max_tokens: 5 }),
    })
    expect(plain.headers.get('x-tropa-explain')).toBeNull()
    expect(plain.headers.get('x-tropa-overhead-ms')).not.toBeNull()
  })

  test('a stream: first token and inter-token latency once, overhead header on the stream', async () => {
    const ttft = { model: 'test/slow', node: 'slow' }
    const before = await metrics(t)
    const { data: stream, response } = await t
      .client()
      .chat.completions.create({ model: 'test/slow', messages, max_tokens: 12, stream: true })
      .withResponse()
    let chunks = 0
    for await (const _ of stream) chunks++
    expect(chunks).toBeGreaterThan(2)
    expect(response.headers.get('x-tropa-overhead-ms')).toMatch(/^\d+(\.\d+)?$/)
    const ok = { endpoint: CHAT, model: 'test/slow', outcome: 'ok' }
    await eventually(
      async () =>
        sample(await metrics(t), 'tropa_requests_total', ok) - sample(before, 'tropa_requests_total', ok) ===
        1,
    )
    const after = await metrics(t)
    const itl = { model: 'test/slow' }
    expect(
      sample(after, 'tropa_inter_token_latency_seconds_count', itl) -
        sample(before, 'tropa_inter_token_latency_seconds_count', itl),
    ).toBe(1)
    // 12 tokens about 5 ms apart: the mean gap is in the buckets above 1 ms.
    expect(sample(after, 'tropa_inter_token_latency_seconds_bucket', { ...itl, le: '0.001' })).toBe(0)
    expect(
      sample(after, 'tropa_time_to_first_token_seconds_count', ttft) -
        sample(before, 'tropa_time_to_first_token_seconds_count', ttft),
    ).toBe(1)
  })

  test('refusals count by outcome: 4xx client_error, 402 limit, upstream failure upstream_error', async () => {
    const before = await metrics(t)
    const client = t.client()
    // A model not in the catalogue: no model label (the client's text never becomes one).
    const notFound = await client.chat.completions
      .create({ model: 'no/such-model', messages })
      .catch((e: unknown) => e)
    expect(notFound).toBeInstanceOf(OpenAI.NotFoundError)
    const tight = await newApiKey(t, { name: 'tight', limit_rub: 0 })
    const limited = await t
      .client(tight.key)
      .chat.completions.create({ model: 'test/chat', messages })
      .catch((e: unknown) => e)
    expect(limited).toBeInstanceOf(OpenAI.APIError)
    expect((limited as InstanceType<typeof OpenAI.APIError>).status).toBe(402)
    const failed = await client.chat.completions
      .create({ model: 'test/broken', messages })
      .catch((e: unknown) => e)
    expect(failed).toBeInstanceOf(OpenAI.APIError)
    expect((failed as InstanceType<typeof OpenAI.APIError>).status).toBeGreaterThanOrEqual(500)
    const after = await metrics(t)
    const delta = (name: string, labels: Record<string, string>) =>
      sample(after, name, labels) - sample(before, name, labels)

    expect(delta('tropa_requests_total', { endpoint: CHAT, model: '', outcome: 'client_error' })).toBe(1)
    expect(delta('tropa_request_duration_seconds_count', { endpoint: CHAT, model: '', status: '4xx' })).toBe(
      1,
    )
    expect(delta('tropa_requests_total', { endpoint: CHAT, model: 'test/chat', outcome: 'limit' })).toBe(1)
    expect(
      delta('tropa_request_duration_seconds_count', { endpoint: CHAT, model: 'test/chat', status: '4xx' }),
    ).toBe(1)
    expect(
      delta('tropa_requests_total', { endpoint: CHAT, model: 'test/broken', outcome: 'upstream_error' }),
    ).toBe(1)
    expect(
      delta('tropa_request_duration_seconds_count', { endpoint: CHAT, model: 'test/broken', status: '5xx' }),
    ).toBe(1)
    // Nothing answered: no first token, nothing billed, no overhead header's histogram.
    expect(delta('tropa_time_to_first_token_seconds_count', { model: 'test/broken', node: 'broken' })).toBe(0)
    expect(delta('tropa_tokens_total', { model: 'test/broken', type: 'prompt' })).toBe(0)
    expect(delta('tropa_requests_total', ok)).toBe(0)
  })

  test('a client that leaves mid-stream is counted cancelled', async () => {
    const cancelled = { endpoint: CHAT, model: 'test/slow', outcome: 'cancelled' }
    const before = sample(await metrics(t), 'tropa_requests_total', cancelled)
    const stream = await t
      .client()
      .chat.completions.create({ model: 'test/slow', messages, max_tokens: 400, stream: true })
    for await (const _ of stream) break
    await eventually(async () => sample(await metrics(t), 'tropa_requests_total', cancelled) === before + 1)
  })

  test('embeddings are measured too, without a first token', async () => {
    const before = await metrics(t)
    await t.client().embeddings.create({ model: 'test/embed', input: 'hello' })
    const after = await metrics(t)
    const labels = { endpoint: '/v1/embeddings', model: 'test/embed', outcome: 'ok' }
    expect(
      sample(after, 'tropa_requests_total', labels) - sample(before, 'tropa_requests_total', labels),
    ).toBe(1)
    expect(
      sample(after, 'tropa_time_to_first_token_seconds_count', { model: 'test/embed', node: 'sim-1' }),
    ).toBe(0)
  })

  test('operations gauges: the ledger queue and batches by status', async () => {
    const text = await metrics(t)
    expect(text).toMatch(/^tropa_ledger_queue_depth \d+$/m)
    expect(text).toMatch(/^tropa_batches\{status="in_progress"\} \d+$/m)
    expect(text).toMatch(/^tropa_batch_lines_pending \d+$/m)
    // The per-node gauges are still there.
    expect(text).toMatch(/^tropa_upstream_in_flight\{node="sim-1"\} \d+$/m)
  })

  test('every request record was closed (none left open)', async () => {
    await eventually(async () => t.svc.telemetry.openCount === 0)
  })
})

describe('per-organization labels', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({ extra: { metrics: { per_org: true, per_org_max: 1 } } })
  })
  afterAll(() => t.stop())

  test('on: requests, tokens and roubles carry org; past the cap, org="other"', async () => {
    await t.client().chat.completions.create({ model: 'test/chat', messages, max_tokens: 3 })
    // A second organization: over per_org_max = 1, so it is counted as "other".
    const org = (await (
      await t.admin('/v1/admin/organizations', { name: 'second', balance_rub: 10 })
    ).json()) as { id: string; master_key: string }
    const key = await newApiKey(t, { name: 'second' }, org.master_key)
    await t.client(key.key).chat.completions.create({ model: 'test/chat', messages, max_tokens: 3 })
    const text = await metrics(t)
    expect(sample(text, 'tropa_requests_total', { ...okLabels, org: t.orgId })).toBe(1)
    expect(sample(text, 'tropa_requests_total', { ...okLabels, org: 'other' })).toBe(1)
    expect(
      sample(text, 'tropa_tokens_total', { model: 'test/chat', type: 'prompt', org: 'other' }),
    ).toBeGreaterThan(0)
    expect(sample(text, 'tropa_billed_rub_total', { model: 'test/chat', org: t.orgId })).toBeGreaterThan(0)
    expect(text).not.toContain(org.id)
    // Histograms are never labelled by organization.
    expect(text).not.toMatch(/tropa_request_duration_seconds_count\{[^}]*org=/)
  })
})

const okLabels = { endpoint: CHAT, model: 'test/chat', outcome: 'ok' }

describe('per-organization labels off (the default)', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa()
  })
  afterAll(() => t.stop())

  test('no org label anywhere', async () => {
    await t.client().chat.completions.create({ model: 'test/chat', messages, max_tokens: 3 })
    const text = await metrics(t)
    expect(sample(text, 'tropa_requests_total', okLabels)).toBe(1)
    expect(text).not.toContain('org=')
    expect(text).not.toContain(t.orgId)
  })
})
