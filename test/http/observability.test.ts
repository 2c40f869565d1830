import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Anthropic from '@anthropic-ai/sdk'
import OpenAI, { toFile } from 'openai'
import { AccessLog } from '../../src/metrics/access-log.ts'
import { ADMIN_TOKEN, CHAT_PRICE, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'
import { until } from '../helpers/webhook-receiver.ts'

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

describe('request metrics, access log and headers', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({
      nodes: [
        { name: 'sim-1', timeScale: 0, seed: 1 },
        { name: 'sim-2', timeScale: 0, seed: 2 },
        { name: 'slow', timeScale: 1, itlMs: 5, ignoreEos: true, seed: 3 },
        { name: 'broken', timeScale: 0, faults: { errorRate: 1 } },
        { name: 'long', timeScale: 1, itlMs: 1, ignoreEos: true, seed: 4 },
      ],
      models: ([a, b, slow, broken, long]) => [
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
          id: 'test/long',
          context_length: 16384,
          pricing: CHAT_PRICE,
          routes: [{ name: 'long', base_url: long!.url, upstream_model: 'chat-up' }],
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
      extra: { access_log: { sink: 'file', path: 'access.log' } },
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

  test('a long stream cut by its client: the tokens counted later still reach the metrics', async () => {
    const labels = { model: 'test/long', type: 'completion' }
    const cancelled = { endpoint: CHAT, model: 'test/long', outcome: 'cancelled' }
    const before = await metrics(t)
    const stream = await t
      .client()
      .chat.completions.create({ model: 'test/long', messages, max_tokens: 6000, stream: true })
    let text = ''
    // Past 8 KiB of text, a cut stream's tokens are counted a slice at a time, after it ended.
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? ''
      if (text.length > 9_000) break
    }
    await eventually(
      async () =>
        sample(await metrics(t), 'tropa_requests_total', cancelled) -
          sample(before, 'tropa_requests_total', cancelled) ===
        1,
    )
    const billed =
      sample(await metrics(t), 'tropa_tokens_total', labels) - sample(before, 'tropa_tokens_total', labels)
    expect(billed).toBeGreaterThan(1000)
  })

  test('a client that gives up before a JSON answer is counted cancelled (499)', async () => {
    const cancelled = { endpoint: CHAT, model: 'test/slow', outcome: 'cancelled' }
    const before = sample(await metrics(t), 'tropa_requests_total', cancelled)
    const abort = new AbortController()
    const pending = t
      .client()
      .chat.completions.create({ model: 'test/slow', messages, max_tokens: 400 }, { signal: abort.signal })
      .catch((e: unknown) => e)
    await Bun.sleep(150)
    abort.abort()
    expect(await pending).toBeInstanceOf(Error)
    await eventually(async () => sample(await metrics(t), 'tropa_requests_total', cancelled) === before + 1)
    const dur = { endpoint: CHAT, model: 'test/slow', status: '4xx' }
    expect(sample(await metrics(t), 'tropa_request_duration_seconds_count', dur)).toBeGreaterThanOrEqual(1)
  })

  test('the other front ends go through the same record: messages, responses, legacy completions', async () => {
    const before = await metrics(t)
    const anthropic = new Anthropic({ baseURL: t.url, apiKey: t.apiKey, maxRetries: 0 })
    const msg = await anthropic.messages
      .create({ model: 'test/chat', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] })
      .withResponse()
    expect(msg.response.headers.get('x-tropa-overhead-ms')).toMatch(/^\d+(\.\d+)?$/)
    const streamed = anthropic.messages.stream({
      model: 'test/slow',
      max_tokens: 6,
      messages: [{ role: 'user', content: 'hi' }],
    })
    await streamed.finalMessage()
    const client = t.client()
    const resp = await client.responses
      .create({ model: 'test/chat', input: 'hi', max_output_tokens: 16 })
      .withResponse()
    expect(resp.response.headers.get('x-tropa-overhead-ms')).toMatch(/^\d+(\.\d+)?$/)
    const legacy = await client.completions
      .create({ model: 'test/chat', prompt: 'hi', max_tokens: 5 })
      .withResponse()
    expect(legacy.response.headers.get('x-tropa-overhead-ms')).toMatch(/^\d+(\.\d+)?$/)
    const delta = async (endpoint: string, model: string) => {
      const labels = { endpoint, model, outcome: 'ok' }
      return (
        sample(await metrics(t), 'tropa_requests_total', labels) -
        sample(before, 'tropa_requests_total', labels)
      )
    }
    expect(await delta('/v1/messages', 'test/chat')).toBe(1)
    await eventually(async () => (await delta('/v1/messages', 'test/slow')) === 1)
    expect(await delta('/v1/responses', 'test/chat')).toBe(1)
    expect(await delta('/v1/completions', 'test/chat')).toBe(1)
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
    expect(text).toMatch(/^tropa_access_log_dropped_total 0$/m)
    // The per-node gauges are still there.
    expect(text).toMatch(/^tropa_upstream_in_flight\{node="sim-1"\} \d+$/m)
  })

  test('the access log has one line per request with its fields, and no secret', async () => {
    // Credentials that must never be written: the API key, the master key, the admin token
    // (here presented to a model endpoint, which refuses it).
    const denied = await t.fetch(CHAT, {
      method: 'POST',
      key: ADMIN_TOKEN,
      body: JSON.stringify({ model: 'test/chat', messages }),
    })
    expect(denied.status).toBe(403)
    const { response } = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages, max_tokens: 7 })
      .withResponse()
    const id = response.headers.get('x-request-id')!
    const path = join(t.dir, 'access.log')
    let lines: Record<string, unknown>[] = []
    await eventually(async () => {
      lines = readFileSync(path, 'utf8')
        .split('\n')
        .filter((l) => l.length > 0)
        .map((l) => JSON.parse(l))
      return lines.some((l) => l.request_id === id)
    })
    const line = lines.find((l) => l.request_id === id)!
    expect(line).toMatchObject({
      org_id: t.orgId,
      endpoint: CHAT,
      model: 'test/chat',
      node: response.headers.get('x-tropa-node'),
      status: 200,
      outcome: 'ok',
      stream: false,
      attempts: 1,
      hedged: false,
    })
    expect(line.key_id).toMatch(/^key_/)
    expect(typeof line.time).toBe('string')
    expect(line.prompt_tokens).toBeGreaterThan(0)
    expect(line.cost_rub).toBe(response.headers.get('x-tropa-cost-rub'))
    for (const f of ['duration_ms', 'ttft_ms', 'overhead_ms']) expect(typeof line[f]).toBe('number')
    expect(line.ttft_ms as number).toBeLessThanOrEqual(line.duration_ms as number)

    // One line per request: ids are unique, and every request of this file so far is there.
    const ids = lines.map((l) => l.request_id)
    expect(new Set(ids).size).toBe(ids.length)
    const deniedLine = lines.find((l) => l.request_id === denied.headers.get('x-request-id'))
    expect(deniedLine).toMatchObject({ status: 403, outcome: 'client_error', key_id: null })
    const counted = sample(await metrics(t), 'tropa_requests_total', ok)
    expect(
      lines.filter((l) => l.endpoint === CHAT && l.model === 'test/chat' && l.outcome === 'ok').length,
    ).toBe(counted)

    const text = readFileSync(path, 'utf8')
    for (const secret of [t.apiKey, t.masterKey, ADMIN_TOKEN]) expect(text).not.toContain(secret)
    expect(text).not.toContain(t.apiKey.slice(3, 20))
  })

  test('the Grafana dashboard and the alert rules ask only for metrics Tropa exports', async () => {
    const exported = new Set([...(await metrics(t)).matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]!))
    const docs = join(import.meta.dir, '../../docs/observability')
    const asked = `${readFileSync(join(docs, 'grafana-dashboard.json'), 'utf8')}${readFileSync(join(docs, 'alerts.yml'), 'utf8')}`
    const names = new Set(
      [...asked.matchAll(/\btropa_[a-z_]+/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, '')),
    )
    expect(names.size).toBeGreaterThan(10)
    for (const name of names) expect({ name, exported: exported.has(name) }).toEqual({ name, exported: true })
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

describe('metrics.requests = false (and no access log)', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({ extra: { metrics: { requests: false } } })
  })
  afterAll(() => t.stop())

  test('no request series move; the overhead header is still sent, and no record is left open', async () => {
    const answer = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages, max_tokens: 3 })
      .withResponse()
    expect(answer.response.status).toBe(200)
    expect(Number(answer.response.headers.get('x-tropa-overhead-ms'))).toBeGreaterThanOrEqual(0)
    const stream = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages, max_tokens: 3, stream: true })
    for await (const _ of stream) {
    }
    const text = await metrics(t)
    expect(sample(text, 'tropa_requests_total', okLabels)).toBe(0)
    expect(text).not.toMatch(/^tropa_requests_total\{/m)
    expect(text).not.toMatch(/^tropa_request_duration_seconds_count\{/m)
    expect(text).not.toMatch(/^tropa_time_to_first_token_seconds_count\{/m)
    expect(await until(() => t.svc.telemetry.openCount === 0)).toBe(true)
  })
})

describe('access log sink', () => {
  test('a file is rotated by size, keeping `keep` old ones', async () => {
    const t = await startTropa({
      extra: { access_log: { sink: 'file', path: 'rot.log', max_bytes: 4096, keep: 2 } },
    })
    try {
      const client = t.client()
      for (let i = 0; i < 40; i++)
        await client.chat.completions.create({ model: 'test/chat', messages, max_tokens: 2 })
      const path = join(t.dir, 'rot.log')
      // Flushed and closed: no write or rotation is under way while the files are read.
      const log = t.svc.telemetry.accessLog!
      await log.stop()
      // Everything is gathered first and compared in one piece, so a failure shows all of it.
      const files = [path, `${path}.1`, `${path}.2`, `${path}.3`].map((f) => {
        if (!existsSync(f)) return { f, size: -1, statuses: [] as number[] }
        const lines = readFileSync(f, 'utf8').trim().split('\n')
        return { f, size: statSync(f).size, statuses: lines.map((l) => JSON.parse(l).status as number) }
      })
      const seen = {
        written: log.written,
        dropped: log.dropped,
        oversized: files.filter((x) => x.size > 4096).map((x) => `${x.f}: ${x.size}`),
        missing: files
          .slice(0, 3)
          .filter((x) => x.size < 0)
          .map((x) => x.f),
        fourthKept: files[3]!.size >= 0,
        notOk: files.flatMap((x) => x.statuses).filter((s) => s !== 200).length,
      }
      expect(seen).toEqual({
        written: 40,
        dropped: 0,
        oversized: [],
        missing: [],
        fourthKept: false,
        notOk: 0,
      })
    } finally {
      await t.stop()
    }
  })

  test('lines gathered in one batch past a whole file are split over rotated files, none over max_bytes', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tropa-access-'))
    try {
      const path = join(dir, 'b.log')
      const log = new AccessLog(
        { sink: 'file', path, maxBytes: 1000, keep: 5, bufferLines: 1000, bufferBytes: 1 << 20 },
        () => {},
      )
      // 30 lines of 100 bytes in one turn of the event loop (as when the loop was busy): one
      // batch of 3,000 bytes for files of 1,000; and one line longer than a whole file.
      for (let i = 0; i < 30; i++)
        log.push(JSON.stringify({ i, pad: 'x'.repeat(99 - 17 - String(i).length) }))
      await log.stop()
      const files = [path, ...Array.from({ length: 5 }, (_, k) => `${path}.${k + 1}`)].filter((f) =>
        existsSync(f),
      )
      const sizes = files.map((f) => statSync(f).size)
      const lines = files
        .reverse()
        .flatMap((f) => readFileSync(f, 'utf8').trim().split('\n'))
        .map((l) => (JSON.parse(l) as { i: number }).i)
      expect({ written: log.written, over: sizes.filter((n) => n > 1000), lines }).toEqual({
        written: 30,
        over: [],
        lines: Array.from({ length: 30 }, (_, i) => i),
      })
      const long = new AccessLog(
        {
          sink: 'file',
          path: join(dir, 'c.log'),
          maxBytes: 100,
          keep: 2,
          bufferLines: 10,
          bufferBytes: 1 << 20,
        },
        () => {},
      )
      long.push(JSON.stringify({ a: 1 }))
      long.push(JSON.stringify({ pad: 'y'.repeat(300) }))
      long.push(JSON.stringify({ b: 2 }))
      await long.stop()
      expect(
        [join(dir, 'c.log.2'), join(dir, 'c.log.1'), join(dir, 'c.log')].map(
          (f) => readFileSync(f, 'utf8').length,
        ),
      ).toEqual([8, 311, 8])
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  test('a full buffer drops lines and counts them; it never waits', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tropa-access-'))
    try {
      const log = new AccessLog(
        {
          sink: 'file',
          path: join(dir, 'a.log'),
          maxBytes: 1 << 20,
          keep: 1,
          bufferLines: 2,
          bufferBytes: 1 << 20,
        },
        () => {},
      )
      // Five lines in one turn of the event loop: the buffer holds two, three are dropped.
      for (let i = 0; i < 5; i++) log.push(JSON.stringify({ i }))
      expect(log.dropped).toBe(3)
      await log.stop()
      expect(log.written).toBe(2)
      expect(readFileSync(join(dir, 'a.log'), 'utf8')).toBe('{"i":0}\n{"i":1}\n')
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe('body capture', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({
      extra: {
        access_log: {
          sink: 'file',
          path: 'bodies.log',
          capture_keys: ['key_set_below'],
          capture_max_chars: 600,
        },
      },
    })
    // Key ids exist only once the test organization is made: the captured one is added here.
    const keys = (await (await t.fetch('/v1/keys', { key: t.masterKey })).json()) as {
      data: { key_id: string }[]
    }
    const capture = (t.svc.telemetry as unknown as { capture: { keys: Set<string> } }).capture
    capture.keys.add(keys.data[0]!.key_id)
  })
  afterAll(() => t.stop())

  const lineOf = async (id: string): Promise<Record<string, unknown>> => {
    let line: Record<string, unknown> | undefined
    await eventually(async () => {
      const path = join(t.dir, 'bodies.log')
      if (!existsSync(path)) return false
      line = readFileSync(path, 'utf8')
        .split('\n')
        .filter((l) => l.length > 0)
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((l) => l.request_id === id)
      return line !== undefined
    })
    return line!
  }

  test('a captured key: request and JSON answer in its line, credentials redacted, long bodies cut', async () => {
    const leaked = 'sk-live-0123456789abcdefghij'
    const { response } = await t
      .client()
      .chat.completions.create({
        model: 'test/chat',
        max_tokens: 5,
        messages: [{ role: 'user', content: `my other key is ${leaked}, keep it safe` }],
      })
      .withResponse()
    const line = await lineOf(response.headers.get('x-request-id')!)
    expect(line.request_body as string).toContain('keep it safe')
    expect(line.request_body as string).toContain('[redacted]')
    expect(line.request_body as string).not.toContain(leaked)
    expect(line.response_body as string).toContain('chat.completion')

    const long = await t
      .client()
      .chat.completions.create({
        model: 'test/chat',
        max_tokens: 5,
        messages: [{ role: 'user', content: 'x'.repeat(5000) }],
      })
      .withResponse()
    const cut = await lineOf(long.response.headers.get('x-request-id')!)
    expect(cut.request_body as string).toMatch(/…\[cut at 600 of \d+ chars\]$/)
    expect((cut.request_body as string).length).toBeLessThan(700)

    // A stream: the request is captured, the answer is not (it is never held).
    const stream = await t
      .client()
      .chat.completions.create({ model: 'test/chat', max_tokens: 5, stream: true, messages })
      .withResponse()
    for await (const _ of stream.data) {
    }
    const streamed = await lineOf(stream.response.headers.get('x-request-id')!)
    expect(streamed.request_body as string).toContain('Kazan')
    expect(streamed.response_body).toBeNull()
  })

  test('another key: no body in its line', async () => {
    const other = await newApiKey(t, { name: 'not captured' })
    const { response } = await t
      .client(other.key)
      .chat.completions.create({ model: 'test/chat', max_tokens: 5, messages })
      .withResponse()
    const line = await lineOf(response.headers.get('x-request-id')!)
    expect(line.status).toBe(200)
    expect('request_body' in line).toBe(false)
    expect('response_body' in line).toBe(false)
  })
})

describe('batch gauges', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({
      nodes: [{ name: 'slow', timeScale: 1, itlMs: 50, ignoreEos: true, seed: 5 }],
      models: ([slow]) => [
        {
          id: 'test/chat',
          context_length: 4096,
          pricing: CHAT_PRICE,
          routes: [{ name: 'slow', base_url: slow!.url, upstream_model: 'chat-up' }],
        },
      ],
    })
  })
  afterAll(() => t.stop())

  test('a running batch shows in tropa_batches and its lines in tropa_batch_lines_pending', async () => {
    const text0 = await metrics(t)
    expect(sample(text0, 'tropa_batches', { status: 'in_progress' })).toBe(0)
    const c = t.client()
    const lines = [1, 2, 3].map((i) =>
      JSON.stringify({
        custom_id: `l${i}`,
        method: 'POST',
        url: '/v1/chat/completions',
        body: { model: 'test/chat', messages, max_tokens: 100 },
      }),
    )
    const file = await c.files.create({
      file: await toFile(Buffer.from(`${lines.join('\n')}\n`), 'b.jsonl'),
      purpose: 'batch',
    })
    const b = await c.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    })
    // Each line takes about 5 s on this node: the batch is seen running with its lines pending.
    await eventually(async () => {
      const text = await metrics(t)
      return (
        sample(text, 'tropa_batches', { status: 'in_progress' }) === 1 &&
        sample(text, 'tropa_batch_lines_pending', {}) === 3
      )
    })
    await c.batches.cancel(b.id)
  })
})

describe('x-tropa-explain after a failover', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({
      nodes: [
        { name: 'bad', timeScale: 0, faults: { errorRate: 1 } },
        { name: 'good', timeScale: 0, seed: 2 },
      ],
      // The failing node looks ten times better, so it is tried first.
      models: ([bad, good]) => [
        {
          id: 'test/chat',
          context_length: 4096,
          pricing: CHAT_PRICE,
          routes: [
            { name: 'bad', base_url: bad!.url, upstream_model: 'chat-up', weight: 10 },
            { name: 'good', base_url: good!.url, upstream_model: 'chat-up', weight: 1 },
          ],
        },
      ],
    })
  })
  afterAll(() => t.stop())

  test('names the node that answered and counts both attempts', async () => {
    const res = await t.fetch(CHAT, {
      method: 'POST',
      headers: { 'x-tropa-explain': '1' },
      body: JSON.stringify({ model: 'test/chat', messages, max_tokens: 5 }),
    })
    expect(res.status).toBe(200)
    expect(res.headers.get('x-tropa-node')).toBe('good')
    const explain = res.headers.get('x-tropa-explain')!
    expect(explain).toContain('node=good')
    expect(explain).toContain('attempts=2')
    expect(explain).toContain('hedged=false')
  })
})
