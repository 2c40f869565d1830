import { expect, test } from 'bun:test'
import {
  COUNT_SLICE_CHARS,
  countTokens,
  countTokensYielding,
  loadTokenizer,
} from '../../src/pipeline/tokens.ts'
import { prng } from '../../src/simulator/text.ts'

test('a long text counted a slice at a time counts exactly as a whole', async () => {
  await loadTokenizer()
  const rand = prng(7)
  const parts = [
    ' the',
    ' word',
    'word',
    '.',
    ', ',
    '  ',
    '\n',
    '\n\n',
    ' 12345',
    '678',
    " don't",
    ' Привет',
    ' 東京',
    ' 🙂',
    '\t',
    ' "quoted"',
    ' {"a":1}',
    '   spaced',
  ]
  for (let round = 0; round < 5; round++) {
    let text = ''
    while (text.length < COUNT_SLICE_CHARS * 4) text += parts[Math.floor(rand() * parts.length)]
    expect(await countTokensYielding(text)).toBe(countTokens(text))
  }
  // One long run with no place to cut is cut anyway (the event loop comes first): the count is at
  // or above the whole's, and within half a percent of it.
  const run = 'x'.repeat(COUNT_SLICE_CHARS * 2)
  const sliced = await countTokensYielding(run)
  expect(sliced).toBeGreaterThanOrEqual(countTokens(run))
  expect(sliced).toBeLessThanOrEqual(Math.ceil(countTokens(run) * 1.005))
})
