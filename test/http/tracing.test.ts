import { afterAll, afterEach, beforeAll, describe, expect, test } from 'bun:test'
import Anthropic from '@anthropic-ai/sdk'
import OpenAI from 'openai'
import { formatRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import { type SimNode, startSimFleet } from '../../src/simulator/index.ts'
import { startChatBatch } from '../helpers/batches.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// OpenTelemetry traces over OTLP/HTTP, received by a collector the test runs: one span tree per
// request with GenAI attributes, continued from the client's traceparent into the upstream's.

interface OtlpSpan {
  traceId: string
  spanId: string
  parentSpanId?: string
  name: string
  status?: { code?: number; message?: string }
  attributes: Record<string, string | number | boolean>
}

/** An OTLP/HTTP (JSON) traces receiver: every span it was sent. */
function startCollector() {
  const spans: OtlpSpan[] = []
  const resources: Record<string, unknown>[] = []
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    async fetch(req) {
      if (new URL(req.url).pathname !== '/v1/traces') return new Response('no', { status: 404 })
      const body = (await req.json()) as {
        resourceSpans: {
          resource: { attributes: Attr[] }
          scopeSpans: { spans: (Omit<OtlpSpan, 'attributes'> & { attributes: Attr[] })[] }[]
        }[]
      }
      for (const rs of body.resourceSpans) {
        resources.push(attrs(rs.resource.attributes))
        for (const ss of rs.scopeSpans)
          for (const s of ss.spans) spans.push({ ...s, attributes: attrs(s.attributes) })
      }
      return Response.json({})
    },
  })
  return { url: `http://127.0.0.1:${server.port}`, spans, resources, stop: () => server.stop(true) }
}
type Attr = { key: string; value: { stringValue?: string; intValue?: number | string; boolValue?: boolean } }
const attrs = (list: Attr[]) =>
  Object.fromEntries(
    list.map((a) => [
      a.key,
      a.value.stringValue ?? (a.value.intValue !== undefined ? Number(a.value.intValue) : a.value.boolValue!),
    ]),
  )

/** A node in front of a simulated one that notes each request's traceparent. */
function startRecordingNode(sim: SimNode) {
  const seen: (string | null)[] = []
  const target = new URL(sim.url)
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    async fetch(req) {
      const url = new URL(req.url)
      if (req.method === 'POST') seen.push(req.headers.get('traceparent'))
      return fetch(`${target.origin}${url.pathname}`, {
        method: req.method,
        headers: req.headers,
        body: req.method === 'POST' ? await req.text() : undefined,
      })
    },
  })
  return { name: 'recorded', url: `http://127.0.0.1:${server.port}/v1`, seen, stop: () => server.stop(true) }
}

let collector: ReturnType<typeof startCollector>
let fleet: Awaited<ReturnType<typeof startSimFleet>>
let node: ReturnType<typeof startRecordingNode>
let t: Tropa | undefined
beforeAll(async () => {
  collector = startCollector()
  fleet = await startSimFleet([{ name: 'sim', seed: 1, timeScale: 0 }])
  node = startRecordingNode(fleet.nodes[0]!)
})
afterEach(async () => {
  await t?.stop()
  t = undefined
})
afterAll(async () => {
  node.stop()
  collector.stop()
  await fleet.stop()
})

const models = (): ModelFile[] => [
  {
    id: 'test/chat',
    owned_by: 'test',
    context_length: 4096,
    pricing: CHAT_PRICE,
    routes: [{ name: node.name, base_url: node.url, upstream_model: 'chat-up' }],
  },
  {
    id: 'test/embed',
    owned_by: 'test',
    kind: 'embedding',
    context_length: 2048,
    dimensions: 256,
    pricing: { prompt: '0.000002', completion: '0.000000' },
    routes: [{ name: node.name, base_url: node.url, upstream_model: 'embed-up' }],
  },
  {
    id: 'test/broken',
    owned_by: 'test',
    context_length: 4096,
    pricing: CHAT_PRICE,
    routes: [{ name: 'nowhere', base_url: 'http://127.0.0.1:9/v1', upstream_model: 'chat-up' }],
  },
]

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736'
const CLIENT_SPAN = '00f067aa0ba902b7'

describe('with OTEL_EXPORTER_OTLP_ENDPOINT set', () => {
  test('a streamed chat: the span tree, GenAI attributes, and the traceparent continued upstream', async () => {
    t = await startTropa({
      models,
      env: { OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, OTEL_SERVICE_NAME: 'tropa-test' },
    })
    const client = new OpenAI({
      baseURL: t.baseURL,
      apiKey: t.apiKey,
      maxRetries: 0,
      defaultHeaders: { traceparent: `00-${TRACE_ID}-${CLIENT_SPAN}-01` },
    })
    const stream = await client.chat.completions
      .create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'hello' }],
        max_tokens: 6,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const requestId = stream.response.headers.get('x-request-id')!
    let usage: (OpenAI.CompletionUsage & { cost_rub?: number }) | undefined
    for await (const chunk of stream.data) if (chunk.usage) usage = chunk.usage
    await t.svc.tracing!.flush()

    const mine = collector.spans.filter((s) => s.traceId === TRACE_ID)
    const root = mine.find((s) => s.name === 'chat')!
    expect(root).toBeDefined()
    // Continued from the client's trace.
    expect(root.parentSpanId).toBe(CLIENT_SPAN)
    const children = mine.filter((s) => s.parentSpanId === root.spanId).map((s) => s.name)
    expect(children.sort()).toEqual(['auth', 'first token', 'reserve', 'settle', 'upstream attempt'])
    expect(root.attributes).toMatchObject({
      'gen_ai.operation.name': 'chat',
      'gen_ai.request.model': 'test/chat',
      'gen_ai.response.model': 'test/chat',
      'gen_ai.provider.name': 'openai',
      'gen_ai.usage.input_tokens': usage!.prompt_tokens,
      'gen_ai.usage.output_tokens': usage!.completion_tokens,
      'tropa.request_id': requestId,
      'tropa.org_id': t.orgId,
      'tropa.node': 'recorded',
    })
    expect(Number(root.attributes['tropa.cost_rub'])).toBe(usage!.cost_rub!)
    expect(String(root.attributes['tropa.key_id'])).toMatch(/^key_/)
    expect(collector.resources.some((r) => r['service.name'] === 'tropa-test')).toBe(true)
    // The upstream saw the attempt's span as its parent, in the same trace.
    const attempt = mine.find((s) => s.name === 'upstream attempt')!
    expect(attempt.attributes).toMatchObject({ 'tropa.node': 'recorded', 'tropa.attempt': 'first' })
    expect(node.seen.at(-1)).toBe(`00-${TRACE_ID}-${attempt.spanId}-01`)
  })

  test('every model endpoint: a root span named for it, with its GenAI operation, reserve, attempt and settle, continued upstream', async () => {
    t = await startTropa({ models, env: { OTEL_EXPORTER_OTLP_ENDPOINT: collector.url } })
    const client = t.client()
    const ids: Record<string, string> = {}
    const chat = await client.chat.completions
      .create({ model: 'test/chat', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 })
      .withResponse()
    ids.chat = chat.response.headers.get('x-request-id')!
    const completion = await client.completions
      .create({ model: 'test/chat', prompt: 'once upon a time', max_tokens: 4 })
      .withResponse()
    ids.completions = completion.response.headers.get('x-request-id')!
    const response = await client.responses
      .create({ model: 'test/chat', input: 'hello', max_output_tokens: 16, store: false })
      .withResponse()
    ids.responses = response.response.headers.get('x-request-id')!
    const embedding = await client.embeddings
      .create({ model: 'test/embed', input: ['a', 'b'] })
      .withResponse()
    ids.embeddings = embedding.response.headers.get('x-request-id')!
    const anthropic = new Anthropic({ baseURL: t.url, apiKey: t.apiKey, maxRetries: 0 })
    const message = await anthropic.messages
      .create({ model: 'test/chat', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] })
      .withResponse()
    ids.messages = message.response.headers.get('x-request-id')!
    await t.svc.tracing!.flush()

    const operation: Record<string, string> = {
      chat: 'chat',
      completions: 'text_completion',
      responses: 'chat',
      embeddings: 'embeddings',
      messages: 'chat',
    }
    for (const [endpoint, id] of Object.entries(ids)) {
      const root = collector.spans.find((s) => s.attributes['tropa.request_id'] === id && !s.parentSpanId)!
      expect(root?.name).toBe(endpoint)
      expect(root.attributes).toMatchObject({
        'gen_ai.operation.name': operation[endpoint]!,
        'tropa.node': 'recorded',
        'tropa.org_id': t.orgId,
      })
      expect(Number(root.attributes['gen_ai.usage.input_tokens'])).toBeGreaterThan(0)
      expect(Number(root.attributes['tropa.cost_rub'])).toBeGreaterThan(0)
      const children = collector.spans.filter((s) => s.parentSpanId === root.spanId).map((s) => s.name)
      for (const name of ['auth', 'reserve', 'upstream attempt', 'settle']) expect(children).toContain(name)
      // The upstream request carried the attempt's span.
      const attempt = collector.spans.find(
        (s) => s.parentSpanId === root.spanId && s.name === 'upstream attempt',
      )!
      expect(node.seen).toContain(`00-${root.traceId}-${attempt.spanId}-01`)
    }
    expect(
      collector.spans.find((s) => s.attributes['tropa.request_id'] === ids.embeddings && !s.parentSpanId)!
        .attributes['gen_ai.response.model'],
    ).toBe('test/embed')
  })

  test('batch lines: a span each, with the batch and line, tokens and cost, continued upstream', async () => {
    t = await startTropa({ models, env: { OTEL_EXPORTER_OTLP_ENDPOINT: collector.url } })
    const client = t.client()
    const seenBefore = node.seen.length
    const batch = await startChatBatch(client, 3, { maxTokens: 4 })
    let done = await client.batches.retrieve(batch.id)
    for (let i = 0; i < 400 && done.status !== 'completed'; i++) {
      await Bun.sleep(25)
      done = await client.batches.retrieve(batch.id)
    }
    expect(done.status).toBe('completed')
    await t.svc.tracing!.flush()
    const lines = collector.spans.filter(
      (s) => s.name === 'batch line' && s.attributes['tropa.batch_id'] === batch.id,
    )
    expect(lines.map((s) => Number(s.attributes['tropa.batch_line'])).sort()).toEqual([1, 2, 3])
    const ledger = await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)
    for (const span of lines) {
      expect(span.parentSpanId ?? '').toBe('')
      expect(span.attributes).toMatchObject({
        'gen_ai.operation.name': 'chat',
        'gen_ai.request.model': 'test/chat',
        'tropa.node': 'recorded',
        'tropa.outcome': 'ok',
      })
      const row = ledger.find((e) => e.requestId === span.attributes['tropa.request_id'])!
      expect(span.attributes['gen_ai.usage.output_tokens']).toBe(row.completionTokens)
      expect(String(span.attributes['tropa.cost_rub'])).toBe(formatRub(row.costNano))
      expect(collector.spans.some((c) => c.parentSpanId === span.spanId && c.name === 'settle')).toBe(true)
      // The line's upstream request carried its span.
      expect(node.seen.slice(seenBefore)).toContain(`00-${span.traceId}-${span.spanId}-01`)
    }
  })

  test('a refused request and a failed upstream end their root span with the error', async () => {
    t = await startTropa({
      models,
      env: { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${collector.url}/v1/traces` },
    })
    const client = t.client()
    const err = await client.chat.completions
      .create({ model: 'test/broken', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.APIError)
    await t.svc.tracing!.flush()
    const root = collector.spans.findLast(
      (s) => s.name === 'chat' && s.attributes['gen_ai.request.model'] === 'test/broken',
    )!
    expect(root.status?.code).toBe(2)
    expect(String(root.attributes['error.type'])).toMatch(/^upstream_|no_upstream/)
    const attempts = collector.spans.filter(
      (s) => s.traceId === root.traceId && s.name === 'upstream attempt',
    )
    expect(attempts.length).toBeGreaterThan(0)
    for (const a of attempts) expect(a.status?.code).toBe(2)
    // No client traceparent: a new trace, with no parent.
    expect(root.parentSpanId ?? '').toBe('')
  })
})

test('without tracing configured: no tracer, and nothing is sent upstream', async () => {
  t = await startTropa({ models })
  expect(t.svc.tracing).toBeUndefined()
  const before = node.seen.length
  await t.client().chat.completions.create({
    model: 'test/chat',
    messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 4,
  })
  expect(node.seen.length).toBe(before + 1)
  expect(node.seen.at(-1)).toBeNull()
})
