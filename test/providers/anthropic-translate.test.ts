import { describe, expect, test } from 'bun:test'
import {
  AnthropicStreamTranslator,
  MAX_LINE_BYTES,
  toChatCompletion,
} from '../../src/upstream/providers/anthropic/reply.ts'
import { toAnthropicRequest } from '../../src/upstream/providers/anthropic/request.ts'

// The translations alone, on inputs the simulator does not produce: an error event mid-stream,
// events split at every byte, an over-long line, and a conversation that needs merging.

const ev = (type: string, data: Record<string, unknown>) =>
  `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`

const STREAM = [
  ev('message_start', {
    message: {
      id: 'msg_1',
      type: 'message',
      role: 'assistant',
      model: 'claude-x',
      content: [],
      usage: {
        input_tokens: 10,
        cache_read_input_tokens: 30,
        cache_creation_input_tokens: 5,
        output_tokens: 1,
      },
    },
  }),
  ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  ev('ping', {}),
  ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hé "there"' } }),
  ev('content_block_stop', { index: 0 }),
  ev('content_block_start', {
    index: 1,
    content_block: { type: 'tool_use', id: 'toolu_1', name: 'f', input: {} },
  }),
  ev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '{"a":' } }),
  ev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '1}' } }),
  ev('content_block_stop', { index: 1 }),
  ev('message_delta', {
    delta: { stop_reason: 'tool_use', stop_sequence: null },
    usage: { output_tokens: 7 },
  }),
  ev('message_stop', {}),
].join('')

const parse = (out: string) =>
  out
    .split('\n\n')
    .filter(Boolean)
    .map((e) => (e === 'data: [DONE]' ? '[DONE]' : JSON.parse(e.slice(6))))

describe('AnthropicStreamTranslator', () => {
  test('events split at every byte come out the same as whole', () => {
    const bytes = new TextEncoder().encode(STREAM)
    const whole = new AnthropicStreamTranslator()
    const a = whole.push(bytes) + whole.end()
    const split = new AnthropicStreamTranslator()
    let b = ''
    for (let i = 0; i < bytes.length; i++) b += split.push(bytes.subarray(i, i + 1))
    b += split.end()
    expect(b).toBe(a)
    const events = parse(a)
    expect(events.at(-1)).toBe('[DONE]')
    const usage = events.at(-2)
    expect(usage.choices).toEqual([])
    expect(usage.usage).toEqual({
      prompt_tokens: 45,
      completion_tokens: 7,
      total_tokens: 52,
      prompt_tokens_details: { cached_tokens: 30 },
    })
    expect(events.at(-3).choices[0].finish_reason).toBe('tool_calls')
    const text = events.map((e) => e.choices?.[0]?.delta?.content ?? '').join('')
    expect(text).toBe('Hé "there"')
    const calls = events.flatMap((e) => e.choices?.[0]?.delta?.tool_calls ?? [])
    expect(calls[0]).toEqual({
      index: 0,
      id: 'toolu_1',
      type: 'function',
      function: { name: 'f', arguments: '' },
    })
    expect(calls.map((c: { function: { arguments: string } }) => c.function.arguments).join('')).toBe(
      '{"a":1}',
    )
  })

  test('an error event mid-stream becomes an OpenAI error event, and nothing follows it', () => {
    const t = new AnthropicStreamTranslator()
    const start = STREAM.slice(0, STREAM.indexOf('event: content_block_stop'))
    const out =
      t.push(new TextEncoder().encode(start)) +
      t.push(
        new TextEncoder().encode(
          `${ev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } })}${ev('message_stop', {})}`,
        ),
      )
    const events = parse(out)
    expect(events.at(-1)).toEqual({
      error: { message: 'Overloaded', type: 'upstream_error', param: null, code: 'overloaded_error' },
    })
    expect(t.finished).toBe(true)
  })

  test('a line longer than the bound ends the stream with an error, holding no more', () => {
    const t = new AnthropicStreamTranslator()
    const big = new TextEncoder().encode(`data: "${'x'.repeat(64 * 1024)}`)
    let out = ''
    for (let i = 0; i < MAX_LINE_BYTES / big.length + 2 && !t.finished; i++) out += t.push(big)
    expect(t.finished).toBe(true)
    expect(parse(out).at(-1).error.message).toContain('over-long')
  })

  test('a hostile stream: fields missing or of the wrong type still make valid JSON, or an error', () => {
    const t = new AnthropicStreamTranslator()
    const out = t.push(
      new TextEncoder().encode(
        ev('message_start', { message: { id: 5, model: null } }) +
          ev('content_block_start', { index: 'x', content_block: { type: 'tool_use' } }) +
          ev('content_block_delta', { index: 'x', delta: { type: 'input_json_delta', partial_json: 7 } }) +
          ev('message_delta', { delta: {}, usage: { output_tokens: 'many' } }) +
          ev('message_stop', {}),
      ),
    )
    const events = parse(out)
    expect(events.at(-1)).toBe('[DONE]')
    expect(events.at(-2).usage.completion_tokens).toBeNull()
    const t2 = new AnthropicStreamTranslator()
    const events2 = parse(t2.push(new TextEncoder().encode(ev('message_stop', {}))))
    expect(events2).toHaveLength(1)
    expect(events2[0].error.message).toContain('message_start')
  })

  test('usage that is not numbers is passed on as not sane (Tropa then counts itself)', () => {
    const c = toChatCompletion({
      id: 'm',
      type: 'message',
      model: 'x',
      content: [{ type: 'text', text: 'hi' }],
      stop_reason: 'end_turn',
      usage: { input_tokens: '12', output_tokens: 3 },
    })
    expect((c.usage as { prompt_tokens: unknown }).prompt_tokens).toBeNull()
  })
})

describe('toAnthropicRequest', () => {
  test('system lifted, same-role turns merged, tool results in a user turn, tool_choice, stop', () => {
    const out = toAnthropicRequest(
      {
        model: 'claude-x',
        max_tokens: 100,
        stop: 'END',
        temperature: 0.2,
        user: 'u-1',
        parallel_tool_calls: false,
        tool_choice: 'required',
        tools: [
          {
            type: 'function',
            function: { name: 'f', parameters: { properties: { q: { type: 'string' } } } },
          },
        ],
        messages: [
          { role: 'system', content: 'S1' },
          { role: 'user', content: 'a' },
          { role: 'user', content: [{ type: 'text', text: 'b' }] },
          {
            role: 'assistant',
            content: '',
            tool_calls: [{ id: 't1', type: 'function', function: { name: 'f', arguments: '{"x":1}' } }],
          },
          { role: 'tool', tool_call_id: 't1', content: 'r1' },
          { role: 'developer', content: 'S2' },
          { role: 'user', content: 'c' },
        ],
      },
      true,
    )
    expect(out).toEqual({
      model: 'claude-x',
      max_tokens: 100,
      stream: true,
      system: [
        { type: 'text', text: 'S1' },
        { type: 'text', text: 'S2' },
      ],
      stop_sequences: ['END'],
      temperature: 0.2,
      metadata: { user_id: 'u-1' },
      tools: [{ name: 'f', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }],
      tool_choice: { type: 'any', disable_parallel_tool_use: true },
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'a' },
            { type: 'text', text: 'b' },
          ],
        },
        { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'f', input: { x: 1 } }] },
        {
          role: 'user',
          content: [
            { type: 'tool_result', tool_use_id: 't1', content: 'r1' },
            { type: 'text', text: 'c' },
          ],
        },
      ],
    })
  })

  test('tool call arguments that are not a JSON object: a 400 naming them', () => {
    expect(() =>
      toAnthropicRequest(
        {
          model: 'x',
          max_tokens: 5,
          messages: [
            {
              role: 'assistant',
              tool_calls: [{ id: 't', type: 'function', function: { name: 'f', arguments: '{oops' } }],
            },
          ],
        },
        false,
      ),
    ).toThrow('messages[0].tool_calls[0].function.arguments is not valid JSON')
  })
})
