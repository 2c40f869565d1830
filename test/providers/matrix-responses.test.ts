import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type OpenAI from 'openai'
import { EACH, expectBilled, meter, startMatrix, WEATHER_PARAMS } from '../helpers/matrix.ts'
import type { Tropa } from '../helpers/start.ts'

// The matrix, inbound /v1/responses (openai SDK) x every upstream provider kind: plain, streamed,
// function_call items (plain and streamed) and the function_call_output's turn; usage and cost exact.

let t: Tropa
let client: OpenAI
beforeAll(async () => {
  t = await startMatrix()
  client = t.client()
}, 30_000)
afterAll(() => t.stop())

const weather: OpenAI.Responses.FunctionTool = {
  type: 'function',
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: WEATHER_PARAMS,
  strict: false,
}
const seen = (u: OpenAI.Responses.ResponseUsage | null | undefined) => {
  expect(u!.total_tokens).toBe(u!.input_tokens + u!.output_tokens)
  return {
    prompt: u!.input_tokens,
    completion: u!.output_tokens,
    costRub: (u as unknown as { cost_rub?: number }).cost_rub,
  }
}

/** A Responses stream: the event types in order, sequence numbers, the final response. */
async function drain(stream: AsyncIterable<OpenAI.Responses.ResponseStreamEvent>) {
  const types: string[] = []
  let text = ''
  let args = ''
  let final: OpenAI.Responses.Response | undefined
  let seq = -1
  for await (const e of stream) {
    types.push(e.type)
    expect(e.sequence_number).toBe(seq + 1)
    seq = e.sequence_number
    if (e.type === 'response.output_text.delta') text += e.delta
    if (e.type === 'response.function_call_arguments.delta') args += e.delta
    if (e.type === 'response.completed' || e.type === 'response.incomplete') final = e.response
  }
  expect(types.slice(0, 2)).toEqual(['response.created', 'response.in_progress'])
  expect(['response.completed', 'response.incomplete']).toContain(types.at(-1)!)
  return { types, text, args, final: final! }
}

describe.each(EACH)('responses x %s', (_kind, p) => {
  test('plain: a response object with a message item, its usage the node’s, the cost exact', async () => {
    const m = meter(t, p)
    const { data: r, response } = await client.responses
      .create({ model: p.model, input: 'Tell me about routers.', max_output_tokens: 24 })
      .withResponse()
    expect(r.object).toBe('response')
    expect(r.id).toMatch(/^resp_/)
    expect(r.model).toBe(p.model)
    expect(['completed', 'incomplete']).toContain(r.status!)
    expect(r.output).toHaveLength(1)
    const item = r.output[0]!
    if (item.type !== 'message') throw new Error(`not a message: ${item.type}`)
    expect(item.role).toBe('assistant')
    expect(item.content[0]!.type).toBe('output_text')
    expect(r.output_text.length).toBeGreaterThan(0)
    await expectBilled(
      t,
      p,
      response.headers.get('x-request-id')!,
      { ...seen(r.usage), header: response.headers.get('x-tropa-cost-rub') },
      m.take(),
    )
  })

  test('streamed: created, output_text deltas, completed with its usage, the cost exact', async () => {
    const m = meter(t, p)
    const { data: stream, response } = await client.responses
      .create({ model: p.model, input: 'Tell me about routers.', max_output_tokens: 24, stream: true })
      .withResponse()
    const { types, text, final } = await drain(stream)
    for (const ty of [
      'response.output_item.added',
      'response.content_part.added',
      'response.output_text.delta',
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
    ])
      expect(types).toContain(ty)
    expect(text.length).toBeGreaterThan(0)
    const item = final.output[0]!
    if (item.type !== 'message') throw new Error(`not a message: ${item.type}`)
    expect(final.output).toHaveLength(1)
    expect(item.content).toEqual([expect.objectContaining({ type: 'output_text', text })])
    expect(final.model).toBe(p.model)
    await expectBilled(t, p, response.headers.get('x-request-id')!, seen(final.usage), m.take())
  })

  test('tools: a function_call item, then the function_call_output answered in words', async () => {
    const m = meter(t, p)
    const q: OpenAI.Responses.ResponseInputItem[] = [{ role: 'user', content: 'Weather in Moscow?' }]
    const { data: first, response } = await client.responses
      .create({ model: p.model, input: q, tools: [weather], max_output_tokens: 64, store: false })
      .withResponse()
    expect(first.status).toBe('completed')
    const calls = first.output.filter((o) => o.type === 'function_call')
    expect(calls).toHaveLength(1)
    const call = calls[0] as OpenAI.Responses.ResponseFunctionToolCall
    expect(call.id).toMatch(/^fc_/)
    expect(call.call_id.length).toBeGreaterThan(0)
    expect(call.name).toBe('get_weather')
    expect(typeof JSON.parse(call.arguments).city).toBe('string')
    await expectBilled(
      t,
      p,
      response.headers.get('x-request-id')!,
      { ...seen(first.usage), header: response.headers.get('x-tropa-cost-rub') },
      m.take(),
    )

    const { data: second, response: r2 } = await client.responses
      .create({
        model: p.model,
        input: [
          ...q,
          call,
          { type: 'function_call_output', call_id: call.call_id, output: '{"temp_c": -5}' },
        ],
        tools: [weather],
        max_output_tokens: 24,
        store: false,
      })
      .withResponse()
    expect(second.output.map((o) => o.type)).toEqual(['message'])
    expect(second.output_text.length).toBeGreaterThan(0)
    expect(second.usage!.input_tokens).toBeGreaterThan(first.usage!.input_tokens)
    await expectBilled(
      t,
      p,
      r2.headers.get('x-request-id')!,
      { ...seen(second.usage), header: r2.headers.get('x-tropa-cost-rub') },
      m.take(),
    )
  })

  test('tools streamed: a function_call item added, its arguments deltas and done; its output streamed back after previous_response_id; costs exact', async () => {
    const m = meter(t, p)
    const { data: stream, response } = await client.responses
      .create({
        model: p.model,
        input: 'Weather in Kazan?',
        tools: [weather],
        tool_choice: { type: 'function', name: 'get_weather' },
        max_output_tokens: 64,
        stream: true,
      })
      .withResponse()
    const { types, args, final } = await drain(stream)
    for (const ty of [
      'response.output_item.added',
      'response.function_call_arguments.delta',
      'response.function_call_arguments.done',
      'response.output_item.done',
    ])
      expect(types).toContain(ty)
    expect(final.status).toBe('completed')
    const calls = final.output.filter((o) => o.type === 'function_call')
    expect(calls).toHaveLength(1)
    const call = calls[0] as OpenAI.Responses.ResponseFunctionToolCall
    expect(call.name).toBe('get_weather')
    expect(call.arguments).toBe(args)
    expect(typeof JSON.parse(args).city).toBe('string')
    await expectBilled(t, p, response.headers.get('x-request-id')!, seen(final.usage), m.take())

    // Stored: the next turn names it and sends only the call's output; the answer streams.
    const { data: s2, response: r2 } = await client.responses
      .create({
        model: p.model,
        previous_response_id: final.id,
        input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"temp_c": 3}' }],
        tools: [weather],
        max_output_tokens: 24,
        stream: true,
      })
      .withResponse()
    const second = await drain(s2)
    expect(second.final.previous_response_id).toBe(final.id)
    expect(second.final.output.map((o) => o.type)).toEqual(['message'])
    expect(second.text.length).toBeGreaterThan(0)
    expect(second.final.usage!.input_tokens).toBeGreaterThan(final.usage!.input_tokens)
    await expectBilled(t, p, r2.headers.get('x-request-id')!, seen(second.final.usage), m.take())
  })
})
