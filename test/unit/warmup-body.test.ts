import { expect, test } from 'bun:test'
import { warmupBody } from '../../src/pipeline/dispatch.ts'

const parse = (s: string | undefined) => JSON.parse(s!) as Record<string, unknown>

test("a session warm-up is the request's own body for one token, streamed with its usage", () => {
  const chat = {
    model: 'up',
    messages: [{ role: 'user', content: 'hi' }],
    tools: [{ type: 'function', function: { name: 'f', parameters: {} } }],
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 500,
    max_completion_tokens: 400,
    n: 3,
    min_tokens: 20,
    logprobs: true,
    top_logprobs: 5,
    prompt_logprobs: 2,
    use_beam_search: true,
    temperature: 0.3,
  }
  expect(parse(warmupBody(JSON.stringify(chat)))).toEqual({
    model: 'up',
    messages: [{ role: 'user', content: 'hi' }],
    tools: [{ type: 'function', function: { name: 'f', parameters: {} } }],
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 1,
    max_completion_tokens: 1,
    n: 1,
    temperature: 0.3,
  })
  // Only max_completion_tokens: that one bound, at 1; none: max_tokens 1.
  expect(parse(warmupBody(JSON.stringify({ model: 'up', messages: [], max_completion_tokens: 9 })))).toEqual({
    model: 'up',
    messages: [],
    stream: true,
    stream_options: { include_usage: true },
    n: 1,
    max_completion_tokens: 1,
  })
  expect(parse(warmupBody(JSON.stringify({ model: 'up', messages: [] })))).toMatchObject({ max_tokens: 1 })
  // Legacy completions: best_of and echo go too; one prompt in an array is fine, several are not warmed.
  expect(
    parse(
      warmupBody(JSON.stringify({ model: 'up', prompt: ['a'], best_of: 4, n: 2, echo: true, max_tokens: 9 })),
    ),
  ).toEqual({
    model: 'up',
    prompt: ['a'],
    best_of: 1,
    n: 1,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 1,
  })
  expect(warmupBody(JSON.stringify({ model: 'up', prompt: ['a', 'b'] }))).toBeUndefined()
  expect(warmupBody('not json')).toBeUndefined()
})
