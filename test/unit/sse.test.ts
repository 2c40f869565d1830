import { expect, test } from 'bun:test'
import { deltaText } from '../../src/upstream/sse.ts'

test('deltaText reads the generated text of a chunk: content, escapes, tool names and arguments', () => {
  const chunk = (delta: unknown) =>
    JSON.stringify({
      id: 'x',
      object: 'chat.completion.chunk',
      model: 'm',
      choices: [{ index: 0, delta, finish_reason: null }],
    })
  expect(deltaText(chunk({ content: ' hello' }))).toBe(' hello')
  expect(deltaText(chunk({ content: 'a "quoted" line\nnext \\ é' }))).toBe('a "quoted" line\nnext \\ é')
  expect(deltaText(chunk({ role: 'assistant', content: '' }))).toBe('')
  expect(
    deltaText(
      chunk({
        tool_calls: [
          { index: 0, id: 'c', type: 'function', function: { name: 'lookup', arguments: '{"q":' } },
        ],
      }),
    ),
  ).toBe('lookup{"q":')
  expect(deltaText(chunk({}))).toBe('')
})
