import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import Anthropic from '@anthropic-ai/sdk'
import { EACH, expectBilled, meter, startMatrix, WEATHER_PARAMS } from '../helpers/matrix.ts'
import type { Tropa } from '../helpers/start.ts'

// The matrix, inbound Anthropic /v1/messages (@anthropic-ai/sdk) x every upstream provider kind:
// plain, streamed, tool_use (plain and streamed) and the tool_result's turn; usage and cost exact.

let t: Tropa
let client: Anthropic
beforeAll(async () => {
  t = await startMatrix()
  client = new Anthropic({ baseURL: t.url, apiKey: t.apiKey, maxRetries: 0, timeout: 20_000 })
}, 30_000)
afterAll(() => t.stop())

const ask = [{ role: 'user' as const, content: 'Tell me about routers.' }]
const weather: Anthropic.Tool = {
  name: 'get_weather',
  description: 'The weather in a city',
  input_schema: WEATHER_PARAMS as Anthropic.Tool.InputSchema,
}
/** Anthropic's input_tokens leaves out the cache reads; the prompt billed is both. */
const seen = (u: Anthropic.Usage | Anthropic.MessageDeltaUsage) => ({
  prompt: (u.input_tokens ?? 0) + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0),
  completion: u.output_tokens,
  costRub: (u as unknown as { cost_rub?: number }).cost_rub,
})

/** A raw Messages stream: the event names in order, the final usage, and the blocks assembled. */
async function drain(stream: AsyncIterable<Anthropic.RawMessageStreamEvent>) {
  const names: string[] = []
  let usage: Anthropic.MessageDeltaUsage | undefined
  let stop: string | null | undefined
  let id = ''
  const blocks: { type: string; text: string; json: string; id?: string; name?: string }[] = []
  for await (const e of stream) {
    names.push(e.type)
    if (e.type === 'message_start') id = e.message.id
    if (e.type === 'content_block_start') {
      const b = e.content_block
      blocks[e.index] = {
        type: b.type,
        text: '',
        json: '',
        ...(b.type === 'tool_use' && { id: b.id, name: b.name }),
      }
    }
    if (e.type === 'content_block_delta') {
      if (e.delta.type === 'text_delta') blocks[e.index]!.text += e.delta.text
      if (e.delta.type === 'input_json_delta') blocks[e.index]!.json += e.delta.partial_json
    }
    if (e.type === 'message_delta') {
      usage = e.usage
      stop = e.delta.stop_reason
    }
  }
  return { names, usage: usage!, stop, id, blocks }
}

/** The documented order: message_start, blocks (start, deltas, stop), message_delta, message_stop. */
function expectEventOrder(names: string[]) {
  expect(names[0]).toBe('message_start')
  expect(names.slice(-2)).toEqual(['message_delta', 'message_stop'])
  const inner = names.slice(1, -2).filter((n) => n !== 'ping')
  expect(inner[0]).toBe('content_block_start')
  expect(inner.at(-1)).toBe('content_block_stop')
  expect(inner.filter((n) => n === 'content_block_delta').length).toBeGreaterThan(0)
  expect(inner.filter((n) => n === 'content_block_start').length).toBe(
    inner.filter((n) => n === 'content_block_stop').length,
  )
}

describe.each(EACH)('messages x %s', (_kind, p) => {
  test('plain: an Anthropic message, its usage the node’s, the cost exact', async () => {
    const m = meter(t, p)
    const { data, response } = await client.messages
      .create({ model: p.model, max_tokens: 24, messages: ask })
      .withResponse()
    const rid = response.headers.get('x-request-id')!
    expect(data.id).toBe(`msg_${rid}`)
    expect(data.type).toBe('message')
    expect(data.role).toBe('assistant')
    expect(data.model).toBe(p.model)
    expect(data.content).toHaveLength(1)
    expect(data.content[0]!.type).toBe('text')
    expect((data.content[0] as Anthropic.TextBlock).text.length).toBeGreaterThan(0)
    expect(['end_turn', 'max_tokens']).toContain(data.stop_reason!)
    await expectBilled(
      t,
      p,
      rid,
      { ...seen(data.usage), header: response.headers.get('x-tropa-cost-rub') },
      m.take(),
    )
  })

  test('streamed: the Messages events in order, text deltas, message_delta’s usage, the cost exact', async () => {
    const m = meter(t, p)
    const { data: stream, response } = await client.messages
      .create({ model: p.model, max_tokens: 24, messages: ask, stream: true })
      .withResponse()
    const rid = response.headers.get('x-request-id')!
    const { names, usage, stop, id, blocks } = await drain(stream)
    expectEventOrder(names)
    expect(id).toBe(`msg_${rid}`)
    expect(blocks.map((b) => b.type)).toEqual(['text'])
    expect(blocks[0]!.text.length).toBeGreaterThan(0)
    expect(['end_turn', 'max_tokens']).toContain(stop!)
    await expectBilled(t, p, rid, seen(usage), m.take())
  })

  test('tools: a tool_use block, then the tool_result answered in words', async () => {
    const m = meter(t, p)
    const q = [{ role: 'user' as const, content: 'Weather in Moscow?' }]
    const { data: first, response } = await client.messages
      .create({ model: p.model, max_tokens: 64, tools: [weather], messages: q })
      .withResponse()
    expect(first.stop_reason).toBe('tool_use')
    const uses = first.content.filter((b) => b.type === 'tool_use') as Anthropic.ToolUseBlock[]
    expect(uses).toHaveLength(1)
    expect(uses[0]!.id.length).toBeGreaterThan(0)
    expect(uses[0]!.name).toBe('get_weather')
    expect(typeof (uses[0]!.input as { city?: unknown }).city).toBe('string')
    await expectBilled(
      t,
      p,
      response.headers.get('x-request-id')!,
      { ...seen(first.usage), header: response.headers.get('x-tropa-cost-rub') },
      m.take(),
    )

    const { data: second, response: r2 } = await client.messages
      .create({
        model: p.model,
        max_tokens: 24,
        tools: [weather],
        messages: [
          ...q,
          { role: 'assistant', content: first.content },
          {
            role: 'user',
            content: [{ type: 'tool_result', tool_use_id: uses[0]!.id, content: '{"temp_c": -5}' }],
          },
        ],
      })
      .withResponse()
    expect(['end_turn', 'max_tokens']).toContain(second.stop_reason!)
    expect(second.content.map((b) => b.type)).toEqual(['text'])
    expect((second.content[0] as Anthropic.TextBlock).text.length).toBeGreaterThan(0)
    expect(seen(second.usage).prompt).toBeGreaterThan(seen(first.usage).prompt)
    await expectBilled(
      t,
      p,
      r2.headers.get('x-request-id')!,
      { ...seen(second.usage), header: r2.headers.get('x-tropa-cost-rub') },
      m.take(),
    )
  })

  test('tools streamed: a tool_use block start, input_json_delta pieces making its input; the tool_result streamed back; costs exact', async () => {
    const m = meter(t, p)
    const q = [{ role: 'user' as const, content: 'Weather in Kazan?' }]
    const { data: stream, response } = await client.messages
      .create({
        model: p.model,
        max_tokens: 64,
        tools: [weather],
        tool_choice: { type: 'tool', name: 'get_weather' },
        messages: q,
        stream: true,
      })
      .withResponse()
    const { names, usage, stop, blocks } = await drain(stream)
    expectEventOrder(names)
    expect(stop).toBe('tool_use')
    const uses = blocks.filter((b) => b.type === 'tool_use')
    expect(uses).toHaveLength(1)
    expect(uses[0]!.id!.length).toBeGreaterThan(0)
    expect(uses[0]!.name).toBe('get_weather')
    expect(typeof JSON.parse(uses[0]!.json).city).toBe('string')
    await expectBilled(t, p, response.headers.get('x-request-id')!, seen(usage), m.take())

    // The tool_use as it streamed (its id included) goes back with its result; the answer streams.
    const use = uses[0]!
    const { data: s2, response: r2 } = await client.messages
      .create({
        model: p.model,
        max_tokens: 24,
        tools: [weather],
        messages: [
          ...q,
          {
            role: 'assistant',
            content: [{ type: 'tool_use', id: use.id!, name: use.name!, input: JSON.parse(use.json) }],
          },
          {
            role: 'user',
            content: [{ type: 'tool_result', tool_use_id: use.id!, content: '{"temp_c": 3}' }],
          },
        ],
        stream: true,
      })
      .withResponse()
    const second = await drain(s2)
    expectEventOrder(second.names)
    expect(second.blocks.map((b) => b.type)).toEqual(['text'])
    expect(second.blocks[0]!.text.length).toBeGreaterThan(0)
    expect(['end_turn', 'max_tokens']).toContain(second.stop!)
    await expectBilled(t, p, r2.headers.get('x-request-id')!, seen(second.usage), m.take())
  })
})
