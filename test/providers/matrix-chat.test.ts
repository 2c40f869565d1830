import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type OpenAI from 'openai'
import { EACH, expectBilled, meter, startMatrix, WEATHER_PARAMS } from '../helpers/matrix.ts'
import type { Tropa } from '../helpers/start.ts'

// The matrix, inbound /v1/chat/completions (openai SDK) x every upstream provider kind: plain,
// streamed, tool calls (plain and streamed) and the tool result's turn; usage and cost exact.

let t: Tropa
let client: OpenAI
beforeAll(async () => {
  t = await startMatrix()
  client = t.client()
}, 30_000)
afterAll(() => t.stop())

const ask = [{ role: 'user' as const, content: 'Tell me about routers.' }]
const weather: OpenAI.ChatCompletionTool = {
  type: 'function',
  function: { name: 'get_weather', description: 'The weather in a city', parameters: WEATHER_PARAMS },
}
const cost = (u: unknown) => (u as { cost_rub?: number } | undefined)?.cost_rub

describe.each(EACH)('chat x %s', (_kind, p) => {
  test('plain: a chat.completion, its usage the node’s, the cost exact', async () => {
    const m = meter(t, p)
    const { data, response } = await client.chat.completions
      .create({ model: p.model, messages: ask, max_tokens: 24 })
      .withResponse()
    const rid = response.headers.get('x-request-id')!
    expect(data.object).toBe('chat.completion')
    expect(data.id).toBe(`chatcmpl-${rid}`)
    expect(data.model).toBe(p.model)
    expect(data.choices[0]!.message.role).toBe('assistant')
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(data.choices[0]!.finish_reason)
    const u = data.usage!
    expect(u.total_tokens).toBe(u.prompt_tokens + u.completion_tokens)
    await expectBilled(
      t,
      p,
      rid,
      {
        prompt: u.prompt_tokens,
        completion: u.completion_tokens,
        costRub: cost(u),
        header: response.headers.get('x-tropa-cost-rub'),
      },
      m.take(),
    )
  })

  test('streamed: chat.completion.chunk deltas, the usage chunk, the cost exact', async () => {
    const m = meter(t, p)
    const { data: stream, response } = await client.chat.completions
      .create({
        model: p.model,
        messages: ask,
        max_tokens: 24,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const rid = response.headers.get('x-request-id')!
    let text = ''
    let finish: string | null = null
    let usage: OpenAI.CompletionUsage | undefined
    let chunks = 0
    for await (const c of stream) {
      chunks++
      expect(c.object).toBe('chat.completion.chunk')
      expect(c.id).toBe(`chatcmpl-${rid}`)
      expect(c.model).toBe(p.model)
      text += c.choices[0]?.delta.content ?? ''
      finish = c.choices[0]?.finish_reason ?? finish
      if (c.usage) {
        expect(c.choices).toEqual([])
        usage = c.usage
      }
    }
    expect(chunks).toBeGreaterThan(2)
    expect(text.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(finish!)
    await expectBilled(
      t,
      p,
      rid,
      { prompt: usage!.prompt_tokens, completion: usage!.completion_tokens, costRub: cost(usage) },
      m.take(),
    )
  })

  test('tools: a tool_calls answer, then the tool message answered in words', async () => {
    const m = meter(t, p)
    const q = [{ role: 'user' as const, content: 'Weather in Moscow?' }]
    const { data: first, response } = await client.chat.completions
      .create({ model: p.model, messages: q, tools: [weather], max_tokens: 64 })
      .withResponse()
    const choice = first.choices[0]!
    expect(choice.finish_reason).toBe('tool_calls')
    expect(choice.message.tool_calls).toHaveLength(1)
    const call = choice.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
    expect(call.type).toBe('function')
    expect(call.id.length).toBeGreaterThan(0)
    expect(call.function.name).toBe('get_weather')
    expect(typeof JSON.parse(call.function.arguments).city).toBe('string')
    await expectBilled(
      t,
      p,
      response.headers.get('x-request-id')!,
      {
        prompt: first.usage!.prompt_tokens,
        completion: first.usage!.completion_tokens,
        costRub: cost(first.usage),
        header: response.headers.get('x-tropa-cost-rub'),
      },
      m.take(),
    )

    const { data: second, response: r2 } = await client.chat.completions
      .create({
        model: p.model,
        messages: [...q, choice.message, { role: 'tool', tool_call_id: call.id, content: '{"temp_c": -5}' }],
        tools: [weather],
        max_tokens: 24,
      })
      .withResponse()
    expect(['stop', 'length']).toContain(second.choices[0]!.finish_reason)
    expect(second.choices[0]!.message.tool_calls ?? []).toEqual([])
    expect(second.choices[0]!.message.content!.length).toBeGreaterThan(0)
    // The earlier turns (the call and its result) are in the prompt.
    expect(second.usage!.prompt_tokens).toBeGreaterThan(first.usage!.prompt_tokens)
    await expectBilled(
      t,
      p,
      r2.headers.get('x-request-id')!,
      {
        prompt: second.usage!.prompt_tokens,
        completion: second.usage!.completion_tokens,
        costRub: cost(second.usage),
        header: r2.headers.get('x-tropa-cost-rub'),
      },
      m.take(),
    )
  })

  test('tools streamed: tool_calls deltas (id, name, JSON arguments), finish tool_calls; the result streamed back; costs exact', async () => {
    const m = meter(t, p)
    const q = [{ role: 'user' as const, content: 'Weather in Kazan?' }]
    const { data: stream, response } = await client.chat.completions
      .create({
        model: p.model,
        messages: q,
        tools: [weather],
        tool_choice: { type: 'function', function: { name: 'get_weather' } },
        max_tokens: 64,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const calls = new Map<number, { id?: string; name?: string; args: string }>()
    let finish: string | null = null
    let usage: OpenAI.CompletionUsage | undefined
    for await (const c of stream) {
      for (const d of c.choices[0]?.delta.tool_calls ?? []) {
        const call = calls.get(d.index) ?? { args: '' }
        if (d.id) call.id = d.id
        if (d.function?.name) call.name = d.function.name
        call.args += d.function?.arguments ?? ''
        calls.set(d.index, call)
      }
      finish = c.choices[0]?.finish_reason ?? finish
      if (c.usage) usage = c.usage
    }
    expect(finish).toBe('tool_calls')
    expect([...calls.keys()]).toEqual([0])
    const call = calls.get(0)!
    expect(call.id!.length).toBeGreaterThan(0)
    expect(call.name).toBe('get_weather')
    expect(typeof JSON.parse(call.args).city).toBe('string')
    await expectBilled(
      t,
      p,
      response.headers.get('x-request-id')!,
      { prompt: usage!.prompt_tokens, completion: usage!.completion_tokens, costRub: cost(usage) },
      m.take(),
    )

    // The call as it streamed (its id included) goes back with its result, and the answer streams.
    const { data: s2, response: r2 } = await client.chat.completions
      .create({
        model: p.model,
        messages: [
          ...q,
          {
            role: 'assistant',
            content: null,
            tool_calls: [
              { id: call.id!, type: 'function', function: { name: call.name!, arguments: call.args } },
            ],
          },
          { role: 'tool', tool_call_id: call.id!, content: '{"temp_c": 3}' },
        ],
        tools: [weather],
        max_tokens: 24,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    let text = ''
    let finish2: string | null = null
    let usage2: OpenAI.CompletionUsage | undefined
    for await (const c of s2) {
      expect(c.choices[0]?.delta.tool_calls).toBeUndefined()
      text += c.choices[0]?.delta.content ?? ''
      finish2 = c.choices[0]?.finish_reason ?? finish2
      if (c.usage) usage2 = c.usage
    }
    expect(text.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(finish2!)
    await expectBilled(
      t,
      p,
      r2.headers.get('x-request-id')!,
      { prompt: usage2!.prompt_tokens, completion: usage2!.completion_tokens, costRub: cost(usage2) },
      m.take(),
    )
  })
})
