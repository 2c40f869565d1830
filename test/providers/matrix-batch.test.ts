import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type OpenAI from 'openai'
import { toFile } from 'openai'
import { batchCostNano, costNano, rubNumberToNano } from '../../src/billing/money.ts'
import { usageRows } from '../helpers/ledger.ts'
import {
  EACH,
  meter,
  PROVIDERS,
  type Provider,
  priceNano,
  startMatrix,
  type Tokens,
  WEATHER_PARAMS,
} from '../helpers/matrix.ts'
import type { Tropa } from '../helpers/start.ts'

// The matrix, inbound batches (openai SDK: files + batches) x every upstream provider kind: one
// batch per endpoint (/v1/chat/completions, /v1/responses, /v1/completions), each with lines for
// every provider's model (plain, a tool call, the tool result's turn); each output line in its
// endpoint's shape, billed at exactly half the live price of the usage it shows.

type Endpoint = '/v1/chat/completions' | '/v1/responses' | '/v1/completions'
type Line = { custom_id: string; method: 'POST'; url: Endpoint; body: Record<string, unknown> }
type Out = {
  custom_id: string
  response: { status_code: number; request_id: string; body: Record<string, unknown> }
  error: unknown
}

const chatTool = {
  type: 'function',
  function: { name: 'get_weather', description: 'The weather in a city', parameters: WEATHER_PARAMS },
}
const respTool = {
  type: 'function',
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: WEATHER_PARAMS,
}
const CALL = { id: 'call_m1', name: 'get_weather', arguments: '{"city":"Moscow"}' }
const ask = { role: 'user', content: 'Weather in Moscow?' }

/** The lines of each endpoint for one provider: [what, body]. */
const LINES: Record<Endpoint, (model: string) => [string, Record<string, unknown>][]> = {
  '/v1/chat/completions': (model) => [
    ['plain', { model, messages: [{ role: 'user', content: 'Tell me about routers.' }], max_tokens: 24 }],
    ['tool-call', { model, messages: [ask], tools: [chatTool], max_tokens: 64 }],
    [
      'tool-result',
      {
        model,
        messages: [
          ask,
          {
            role: 'assistant',
            content: null,
            tool_calls: [
              { id: CALL.id, type: 'function', function: { name: CALL.name, arguments: CALL.arguments } },
            ],
          },
          { role: 'tool', tool_call_id: CALL.id, content: '{"temp_c": -5}' },
        ],
        tools: [chatTool],
        max_tokens: 24,
      },
    ],
  ],
  '/v1/responses': (model) => [
    ['plain', { model, input: 'Tell me about routers.', max_output_tokens: 24 }],
    ['tool-call', { model, input: 'Weather in Moscow?', tools: [respTool], max_output_tokens: 64 }],
    [
      'tool-result',
      {
        model,
        input: [
          ask,
          { type: 'function_call', call_id: CALL.id, name: CALL.name, arguments: CALL.arguments },
          { type: 'function_call_output', call_id: CALL.id, output: '{"temp_c": -5}' },
        ],
        tools: [respTool],
        max_output_tokens: 24,
      },
    ],
  ],
  '/v1/completions': (model) => [['plain', { model, prompt: 'Write a line about rivers', max_tokens: 24 }]],
}
const ENDPOINTS = Object.keys(LINES) as Endpoint[]

let t: Tropa
let client: OpenAI
/** Per endpoint: the batch as retrieved when done, and its output lines by custom_id. */
const done = new Map<Endpoint, { batch: OpenAI.Batch; out: Map<string, Out> }>()
/** Per provider kind: what its node counted while the batches ran. */
const nodeTokens = new Map<string, Tokens>()

async function runBatch(endpoint: Endpoint) {
  const lines: Line[] = PROVIDERS.flatMap((p) =>
    LINES[endpoint](p.model).map(([what, body]) => ({
      custom_id: `${p.kind}:${what}`,
      method: 'POST' as const,
      url: endpoint,
      body,
    })),
  )
  const file = await client.files.create({
    file: await toFile(Buffer.from(`${lines.map((l) => JSON.stringify(l)).join('\n')}\n`), 'matrix.jsonl'),
    purpose: 'batch',
  })
  let batch = await client.batches.create({ input_file_id: file.id, endpoint, completion_window: '24h' })
  for (let i = 0; i < 1200 && !['completed', 'failed', 'expired', 'cancelled'].includes(batch.status); i++) {
    await Bun.sleep(25)
    batch = await client.batches.retrieve(batch.id)
  }
  const text = batch.output_file_id ? await (await client.files.content(batch.output_file_id)).text() : ''
  const out = new Map(
    text
      .trim()
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Out)
      .map((o) => [o.custom_id, o]),
  )
  done.set(endpoint, { batch, out })
}

beforeAll(async () => {
  t = await startMatrix()
  client = t.client()
  const meters = PROVIDERS.map((p) => [p.kind, meter(t, p)] as const)
  await Promise.all(ENDPOINTS.map(runBatch))
  for (const [kind, m] of meters) nodeTokens.set(kind, m.take())
}, 60_000)
afterAll(() => t.stop())

/** The usage an output line shows, in chat's terms. */
function usageOf(endpoint: Endpoint, body: Record<string, unknown>): Tokens {
  if (endpoint === '/v1/responses') {
    const u = body.usage as OpenAI.Responses.ResponseUsage
    expect(u.total_tokens).toBe(u.input_tokens + u.output_tokens)
    return { prompt: u.input_tokens, completion: u.output_tokens }
  }
  const u = body.usage as OpenAI.CompletionUsage
  expect(u.total_tokens).toBe(u.prompt_tokens + u.completion_tokens)
  return { prompt: u.prompt_tokens, completion: u.completion_tokens }
}

/** An output line's body is in its endpoint's shape; what it holds for a line of kind `what`. */
function expectShape(endpoint: Endpoint, what: string, p: Provider, body: Record<string, unknown>) {
  expect(body.model).toBe(p.model)
  if (endpoint === '/v1/chat/completions') {
    const c = body as unknown as OpenAI.ChatCompletion
    expect(c.object).toBe('chat.completion')
    expect(c.id).toMatch(/^chatcmpl-/)
    const choice = c.choices[0]!
    if (what === 'tool-call') {
      expect(choice.finish_reason).toBe('tool_calls')
      expect(choice.message.tool_calls).toHaveLength(1)
      const call = choice.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall
      expect(call.type).toBe('function')
      expect(call.id.length).toBeGreaterThan(0)
      expect(call.function.name).toBe('get_weather')
      expect(typeof JSON.parse(call.function.arguments).city).toBe('string')
    } else {
      expect(['stop', 'length']).toContain(choice.finish_reason)
      expect(choice.message.tool_calls ?? []).toEqual([])
      expect(choice.message.content!.length).toBeGreaterThan(0)
    }
  } else if (endpoint === '/v1/responses') {
    const r = body as unknown as OpenAI.Responses.Response
    expect(r.object).toBe('response')
    expect(r.id).toMatch(/^resp_/)
    expect(r.output).toHaveLength(1)
    const item = r.output[0]!
    if (what === 'tool-call') {
      expect(r.status).toBe('completed')
      if (item.type !== 'function_call') throw new Error(`not a function_call: ${item.type}`)
      expect(item.name).toBe('get_weather')
      expect(item.call_id.length).toBeGreaterThan(0)
      expect(typeof JSON.parse(item.arguments).city).toBe('string')
    } else {
      expect(['completed', 'incomplete']).toContain(r.status!)
      if (item.type !== 'message') throw new Error(`not a message: ${item.type}`)
      expect(item.content[0]).toMatchObject({ type: 'output_text' })
      expect((item.content[0] as { text: string }).text.length).toBeGreaterThan(0)
    }
  } else {
    const c = body as unknown as OpenAI.Completion
    expect(c.object).toBe('text_completion')
    expect(c.id).toMatch(/^cmpl-/)
    expect(c.choices[0]!.text.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(c.choices[0]!.finish_reason)
  }
}

describe.each(ENDPOINTS.flatMap((e) => EACH.map(([kind, p]) => [e, kind, p] as const)))(
  'batch %s x %s',
  (endpoint, _kind, p) => {
    test('each line in the endpoint’s shape, its ledger row at exactly half its usage’s live price', async () => {
      const { batch, out } = done.get(endpoint)!
      expect(batch.status).toBe('completed')
      const rows = (await usageRows(t)).filter((r) => r.batchId === batch.id)
      for (const [what] of LINES[endpoint](p.model)) {
        const o = out.get(`${p.kind}:${what}`)!
        expect(o.error).toBeNull()
        expect(o.response.status_code).toBe(200)
        expectShape(endpoint, what, p, o.response.body)
        const u = usageOf(endpoint, o.response.body)
        expect(u.completion).toBeGreaterThan(0)
        const mine = rows.filter((r) => r.requestId === o.response.request_id)
        expect(mine).toHaveLength(1)
        expect(mine[0]).toMatchObject({
          model: p.model,
          node: p.kind,
          promptTokens: u.prompt,
          completionTokens: u.completion,
          costNano: batchCostNano(costNano(u.prompt, u.completion, priceNano(p))),
          estimated: false,
          outcome: 'ok',
        })
      }
    })
  },
)

describe('batches: totals', () => {
  test('every line done; a batch’s cost_rub is the sum of its rows', async () => {
    const all = await usageRows(t)
    for (const endpoint of ENDPOINTS) {
      const { batch, out } = done.get(endpoint)!
      const lines = PROVIDERS.length * LINES[endpoint]('x').length
      expect(batch.request_counts).toEqual({ total: lines, completed: lines, failed: 0 })
      expect(out.size).toBe(lines)
      const rows = all.filter((r) => r.batchId === batch.id)
      expect(rows).toHaveLength(lines)
      const sum = rows.reduce((s, r) => s + r.costNano, 0n)
      expect(rubNumberToNano((batch as unknown as { cost_rub: number }).cost_rub)).toBe(sum)
    }
  })

  test.each(EACH)('%s: the usage the lines show is what the node counted', (_kind, p) => {
    const shown = { prompt: 0, completion: 0 }
    for (const endpoint of ENDPOINTS)
      for (const [what] of LINES[endpoint](p.model)) {
        const u = usageOf(endpoint, done.get(endpoint)!.out.get(`${p.kind}:${what}`)!.response.body)
        shown.prompt += u.prompt
        shown.completion += u.completion
      }
    expect(shown).toEqual(nodeTokens.get(p.kind)!)
  })
})
