import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import Anthropic from '@anthropic-ai/sdk'
import { type SimNode, startSimNode } from '../../src/simulator/index.ts'
import { ANTHROPIC_SIM_KEY } from '../../src/simulator/protocols/anthropic.ts'

// The simulated Messages API checked with Anthropic's official SDK as its client: what the SDK
// sends is accepted, and what the fake answers is what the SDK reads (types, events, errors).

let node: SimNode
let client: Anthropic
const origin = () => node.url.replace(/\/v1$/, '')

beforeAll(async () => {
  node = await startSimNode({ name: 'ant-1', timeScale: 0, seed: 1, protocol: 'anthropic' })
  client = new Anthropic({ apiKey: ANTHROPIC_SIM_KEY, baseURL: origin(), maxRetries: 0 })
})
afterAll(() => node.stop())

const weather = {
  name: 'get_weather',
  description: 'The weather in a city',
  input_schema: {
    type: 'object' as const,
    properties: { city: { type: 'string' } },
    required: ['city'],
  },
}

describe('simulated Anthropic Messages API, with @anthropic-ai/sdk', () => {
  test('messages.create: a message with text, a stop reason and usage', async () => {
    const m = await client.messages.create({
      model: 'claude-sim',
      max_tokens: 200,
      system: 'Be brief.',
      messages: [{ role: 'user', content: 'Say hello' }],
    })
    expect(m.type).toBe('message')
    expect(m.role).toBe('assistant')
    expect(m.id).toStartWith('msg_')
    expect(m.model).toBe('claude-sim')
    expect(m.content).toHaveLength(1)
    const block = m.content[0]!
    expect(block.type).toBe('text')
    expect(block.type === 'text' && block.text.length > 0).toBe(true)
    expect(m.stop_reason).toBe('end_turn')
    expect(m.stop_sequence).toBeNull()
    expect(m.usage.input_tokens).toBeGreaterThan(0)
    expect(m.usage.output_tokens).toBeGreaterThan(0)
    expect(m.usage.cache_read_input_tokens).toBe(0)
  })

  test('max_tokens bounds the answer: stop_reason max_tokens', async () => {
    const m = await client.messages.create({
      model: 'claude-sim',
      max_tokens: 2,
      messages: [{ role: 'user', content: 'Tell me a long story' }],
    })
    expect(m.stop_reason).toBe('max_tokens')
    expect(m.usage.output_tokens).toBe(2)
  })

  test('the same prompt again reads the cache: cache_read_input_tokens, input_tokens without them', async () => {
    const long = 'word '.repeat(300)
    const ask = () =>
      client.messages.create({
        model: 'claude-sim',
        max_tokens: 20,
        messages: [{ role: 'user', content: long }],
      })
    const a = await ask()
    const b = await ask()
    expect(b.usage.cache_read_input_tokens).toBeGreaterThan(0)
    expect(b.usage.input_tokens + (b.usage.cache_read_input_tokens ?? 0)).toBe(a.usage.input_tokens)
  })

  test('messages.stream: the event sequence, finalMessage equal to the text streamed', async () => {
    const stream = client.messages.stream({
      model: 'claude-sim',
      max_tokens: 200,
      messages: [{ role: 'user', content: 'Say hello' }],
    })
    const events: string[] = []
    let text = ''
    stream.on('streamEvent', (e) => events.push(e.type))
    stream.on('text', (t) => {
      text += t
    })
    const m = await stream.finalMessage()
    expect(events[0]).toBe('message_start')
    expect(events[1]).toBe('content_block_start')
    expect(events).toContain('content_block_delta')
    expect(events.slice(-3)).toEqual(['content_block_stop', 'message_delta', 'message_stop'])
    const block = m.content[0]!
    expect(block.type === 'text' && block.text).toBe(text)
    expect(m.stop_reason).toBe('end_turn')
    expect(m.usage.output_tokens).toBeGreaterThan(1)
    expect(m.usage.input_tokens).toBeGreaterThan(0)
  })

  test('the raw stream carries ping and the documented event names', async () => {
    const res = await fetch(`${origin()}/v1/messages`, {
      method: 'POST',
      headers: {
        'x-api-key': ANTHROPIC_SIM_KEY,
        'anthropic-version': '2023-06-01',
        'content-type': 'application/json',
      },
      body: JSON.stringify({
        model: 'claude-sim',
        max_tokens: 50,
        stream: true,
        messages: [{ role: 'user', content: 'hi' }],
      }),
    })
    expect(res.headers.get('content-type')).toStartWith('text/event-stream')
    const names = [...(await res.text()).matchAll(/^event: (\w+)$/gm)].map((m) => m[1])
    expect(names.slice(0, 3)).toEqual(['message_start', 'content_block_start', 'ping'])
    expect(names.at(-1)).toBe('message_stop')
  })

  test('tools: a tool_use block (plain and streamed), then a tool_result turn answered with text', async () => {
    const m = await client.messages.create({
      model: 'claude-sim',
      max_tokens: 200,
      tools: [weather],
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    })
    expect(m.stop_reason).toBe('tool_use')
    const use = m.content.find((b) => b.type === 'tool_use')
    expect(use?.type).toBe('tool_use')
    if (use?.type !== 'tool_use') throw new Error('no tool_use')
    expect(use.id).toStartWith('toolu_')
    expect(use.name).toBe('get_weather')
    expect(typeof (use.input as { city: unknown }).city).toBe('string')

    const streamed = await client.messages
      .stream({
        model: 'claude-sim',
        max_tokens: 200,
        tools: [weather],
        tool_choice: { type: 'tool', name: 'get_weather' },
        messages: [{ role: 'user', content: 'Weather in Paris?' }],
      })
      .finalMessage()
    expect(streamed.stop_reason).toBe('tool_use')
    const su = streamed.content.find((b) => b.type === 'tool_use')
    expect(su?.type === 'tool_use' && su.input).toEqual(use.input)

    const after = await client.messages.create({
      model: 'claude-sim',
      max_tokens: 200,
      tools: [weather],
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: m.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny, 21C' }] },
      ],
    })
    expect(after.stop_reason).toBe('end_turn')
    expect(after.content[0]?.type).toBe('text')
  })

  test('stop_sequences: the text ends before the sequence, stop_reason stop_sequence', async () => {
    const ask = {
      model: 'claude-sim',
      max_tokens: 100,
      messages: [{ role: 'user' as const, content: 'Go on' }],
    }
    const full = await client.messages.create(ask)
    const text = full.content[0]?.type === 'text' ? full.content[0].text : ''
    const words = text.split(' ')
    const stop = ` ${words[3]}`
    const cut = await client.messages.create({ ...ask, stop_sequences: [stop] })
    const cutText = cut.content[0]?.type === 'text' ? cut.content[0].text : ''
    expect(cut.stop_reason).toBe('stop_sequence')
    expect(cut.stop_sequence).toBe(stop)
    expect(cutText).toBe(text.slice(0, text.indexOf(stop)))
    const streamed = await client.messages.stream({ ...ask, stop_sequences: [stop] }).finalMessage()
    expect(streamed.stop_reason).toBe('stop_sequence')
    expect(streamed.content[0]?.type === 'text' && streamed.content[0].text).toBe(cutText)
  })

  test('images: base64 and url sources are accepted and cost tokens', async () => {
    const png =
      'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='
    const m = await client.messages.create({
      model: 'claude-sim',
      max_tokens: 20,
      messages: [
        {
          role: 'user',
          content: [
            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } },
            { type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } },
            { type: 'text', text: 'What is this?' },
          ],
        },
      ],
    })
    expect(m.usage.input_tokens).toBeGreaterThan(170)
  })

  test('a wrong key: AuthenticationError with an authentication_error body', async () => {
    const bad = new Anthropic({ apiKey: 'sk-ant-wrong', baseURL: origin(), maxRetries: 0 })
    const err = await bad.messages
      .create({ model: 'claude-sim', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] })
      .catch((e) => e)
    expect(err).toBeInstanceOf(Anthropic.AuthenticationError)
    expect(err.status).toBe(401)
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'authentication_error' } })
  })

  test('a request the API refuses: BadRequestError (missing max_tokens, system role, temperature)', async () => {
    for (const body of [
      { model: 'claude-sim', messages: [{ role: 'user', content: 'hi' }] },
      { model: 'claude-sim', max_tokens: 5, messages: [{ role: 'system', content: 'hi' }] },
      { model: 'claude-sim', max_tokens: 5, temperature: 1.5, messages: [{ role: 'user', content: 'hi' }] },
    ]) {
      const err = await client.messages.create(body as never).catch((e) => e)
      expect(err).toBeInstanceOf(Anthropic.BadRequestError)
      expect(err.error).toMatchObject({ type: 'error', error: { type: 'invalid_request_error' } })
    }
  })

  test('API versions: 2023-06-01 with x-api-key takes temperature up to 1; 2026-10-21 (the SDK) refuses it', async () => {
    const raw = (temperature: number) =>
      fetch(`${origin()}/v1/messages`, {
        method: 'POST',
        headers: {
          'x-api-key': ANTHROPIC_SIM_KEY,
          'anthropic-version': '2023-06-01',
          'content-type': 'application/json',
        },
        body: JSON.stringify({
          model: 'claude-sim',
          max_tokens: 5,
          temperature,
          messages: [{ role: 'user', content: 'hi' }],
        }),
      })
    expect((await raw(0.5)).status).toBe(200)
    expect((await raw(1.5)).status).toBe(400)
    const err = await client.messages
      .create({
        model: 'claude-sim',
        max_tokens: 5,
        temperature: 0.5,
        messages: [{ role: 'user', content: 'hi' }],
      } as never)
      .catch((e) => e)
    expect(err).toBeInstanceOf(Anthropic.BadRequestError)
    expect(err.error.error.message).toContain('temperature')
  })

  test('no anthropic-version header: 400', async () => {
    const res = await fetch(`${origin()}/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': ANTHROPIC_SIM_KEY, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'claude-sim',
        max_tokens: 5,
        messages: [{ role: 'user', content: 'hi' }],
      }),
    })
    expect(res.status).toBe(400)
    expect(await res.json()).toMatchObject({ type: 'error', error: { type: 'invalid_request_error' } })
  })

  test('faults: 500 api_error, 429 rate_limit_error, 503 as 529 overloaded_error', async () => {
    const cases = [
      [{ errorRate: 1 }, 500, 'api_error', Anthropic.InternalServerError],
      [{ rate429: 1 }, 429, 'rate_limit_error', Anthropic.RateLimitError],
      [{ rate503: 1 }, 529, 'overloaded_error', Anthropic.InternalServerError],
    ] as const
    try {
      for (const [f, status, type, cls] of cases) {
        node.setFaults({ errorRate: 0, rate429: 0, rate503: 0, ...f })
        const err = await client.messages
          .create({ model: 'claude-sim', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] })
          .catch((e) => e)
        expect(err).toBeInstanceOf(cls)
        expect(err.status).toBe(status)
        expect(err.error).toMatchObject({ type: 'error', error: { type } })
      }
    } finally {
      node.setFaults({ errorRate: 0, rate429: 0, rate503: 0 })
    }
  })
})
