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

test('ASCII text is split as the library splits it, and counted as it counts it, without its Unicode pattern', async () => {
  await loadTokenizer()
  const { asciiSplitPieces, countTokens: count } = await import('../../src/tokenizer.ts')
  const library = await import('../../src/tokenizer-tables.ts')
  const PLAIN = { disallowedSpecial: new Set<string>() }
  const rand = prng(11)
  // Every ASCII character, with the ones the pattern treats apart weighted up: letters of both
  // cases, digits, apostrophes and contractions, CR, LF, '/', spaces and tabs, punctuation.
  const all = Array.from({ length: 128 }, (_, i) => String.fromCharCode(i))
  const heavy = [
    ...'aAzZmMsStTdD019 \t\r\n/\'"-.,;:!?(){}[]_<>@#$%^&*+=|\\`~',
    "'s",
    "'LL",
    "'ve",
    "'Re",
    '  ',
    '\r\n',
    ' \n',
  ]
  const pick = () =>
    rand() < 0.3 ? all[Math.floor(rand() * all.length)]! : heavy[Math.floor(rand() * heavy.length)]!
  const words = [
    'The',
    'quick',
    'BROWN',
    'fox',
    "don't",
    'JSON',
    'camelCase',
    'x86_64',
    '2026',
    ' ',
    '\n',
    '  ',
    'http://a.b/c',
  ]
  for (let round = 0; round < 3000; round++) {
    let text = ''
    const len = 1 + Math.floor(rand() * 60)
    for (let i = 0; i < len; i++) text += rand() < 0.7 ? pick() : words[Math.floor(rand() * words.length)]!
    const { library: want, ascii: got } = asciiSplitPieces(text)
    expect(got).toEqual(want)
    expect(count(text)).toBe(library.countTokens(text, PLAIN))
  }
  // Text with one non-ASCII character is split by the library's pattern: the same count.
  for (const text of ['naïve café', 'Привет, мир', 'emoji 🙂 here', 'tab\tand\u00a0nbsp'])
    expect(count(text)).toBe(library.countTokens(text, PLAIN))
})

test("counting has its own cache: the library's count in any script, a cache hit or a miss, and the library's cache never written", async () => {
  await loadTokenizer()
  const { countTokens: count } = await import('../../src/tokenizer.ts')
  const library = await import('../../src/tokenizer-tables.ts')
  const core = (
    library.encoding as unknown as { bytePairEncodingCoreProcessor: { mergeCache?: Map<string, number[]> } }
  ).bytePairEncodingCoreProcessor
  const PLAIN = { disallowedSpecial: new Set<string>() }
  const rand = prng(23)
  // Letters of several scripts, marks, digits, punctuation, whitespace, emoji (surrogate pairs).
  const alphabets = [
    'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ',
    'абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯ',
    '東京大阪日本語中文字漢',
    'ابتثجحخدذرزسشصضطظعغفقكلمنهوي',
    'éèêëçñöüß\u0301\u0308',
    '0123456789',
    ' .,;:!?\'"()-\n\t\u00a0/',
    '🙂🚀👍🏽',
    // control characters and lone halves of surrogate pairs
    '\u0000\u0007\u001b\ud83d\u200b\udc00\ufeff',
  ]
  const word = () => {
    const a = alphabets[Math.floor(rand() * alphabets.length)]!
    const chars = [...a]
    let w = rand() < 0.6 ? ' ' : ''
    for (let i = 1 + Math.floor(rand() * 9); i > 0; i--) w += chars[Math.floor(rand() * chars.length)]
    return w
  }
  const texts = Array.from({ length: 400 }, () =>
    Array.from({ length: 1 + Math.floor(rand() * 40) }, word).join(''),
  )
  const cached = core.mergeCache?.size
  for (const text of texts) expect(count(text)).toBe(library.countTokens(text, PLAIN))
  // The library's count above goes through its cache; counting alone does not.
  const before = core.mergeCache?.size
  const novel = Array.from({ length: 200 }, () => Array.from({ length: 20 }, word).join(''))
  const want = novel.map((t) => library.countTokens(t, PLAIN))
  const after = core.mergeCache?.size
  core.mergeCache?.clear()
  for (const [i, t] of novel.entries()) expect(count(t)).toBe(want[i]!)
  // Again, every piece now a hit in counting's cache.
  for (const [i, t] of novel.entries()) expect(count(t)).toBe(want[i]!)
  expect(core.mergeCache?.size ?? 0).toBe(0)
  expect(before).toBeGreaterThanOrEqual(cached ?? 0)
  expect(after).toBeGreaterThan(0)
  // More distinct pieces than the cache holds (it starts again empty when full): still exact.
  const many = Array.from({ length: 20_000 }, () => ` ${Math.floor(rand() * 1e12).toString(36)}`).join('')
  expect(count(many)).toBe(library.countTokens(many, PLAIN))
  expect(count(many)).toBe(library.countTokens(many, PLAIN))
})

test('a long text counted again is looked up by its digest, per organization, and the count is the same as counting it: whole, in slices, cut short by a limit, in a chat prompt', async () => {
  await loadTokenizer()
  const { PromptCounter, countChatPromptLive, countsKept } = await import('../../src/pipeline/tokens.ts')
  const rand = prng(31)
  const parts = [' the', ' word', '.', ',', '\n\n', ' 12345', ' Привет', ' 東京', ' 🙂', '   ', '\t', ' x']
  const text = (chars: number) => {
    let t = ''
    while (t.length < chars) t += parts[Math.floor(rand() * parts.length)]
    return t
  }
  // Short (under the cache's floor), one slice, several slices.
  const texts = [text(300), text(600), text(5000), text(COUNT_SLICE_CHARS * 3 + 17)]
  const uncached = async (t: string) => {
    const c = new PromptCounter()
    await c.add(t)
    return c.n
  }
  const counted = async (t: string, scope: string, limit = Number.POSITIVE_INFINITY) => {
    const c = new PromptCounter(limit, scope)
    await c.add(t)
    return c.n
  }
  const want = await Promise.all(texts.map(uncached))
  const kept = countsKept()
  for (const [i, t] of texts.entries()) expect(await counted(t, 'org-a')).toBe(want[i]!)
  // The three long ones are kept (not the short one), once; again, they are hits.
  expect(countsKept()).toBe(kept + 3)
  for (let round = 0; round < 2; round++)
    for (const [i, t] of texts.entries()) expect(await counted(t, 'org-a')).toBe(want[i]!)
  expect(countsKept()).toBe(kept + 3)
  // Another organization's are its own.
  expect(await counted(texts[1]!, 'org-b')).toBe(want[1]!)
  expect(countsKept()).toBe(kept + 4)
  // Cut short by a limit: that partial count is not kept for the text.
  const long = text(COUNT_SLICE_CHARS * 4)
  expect(await counted(long, 'org-a', 10)).toBeLessThan(await uncached(long))
  expect(countsKept()).toBe(kept + 4)
  expect(await counted(long, 'org-a')).toBe(await uncached(long))
  expect(countsKept()).toBe(kept + 5)
  // A chat prompt's texts: the same count the first time and the next.
  const messages = [
    { role: 'system' as const, content: texts[2]! },
    { role: 'user' as const, content: text(700) },
  ]
  const first = await countChatPromptLive(messages, undefined, Number.POSITIVE_INFINITY, 'org-a')
  expect(countsKept()).toBe(kept + 6)
  expect(await countChatPromptLive(messages, undefined, Number.POSITIVE_INFINITY, 'org-a')).toBe(first)
  expect(await countChatPromptLive(messages, undefined, Number.POSITIVE_INFINITY)).toBe(first)
  expect(countsKept()).toBe(kept + 6)
  // Text with a lone surrogate is counted, not looked up: the same count either way.
  const odd = `${texts[1]!}\ud800${texts[1]!}`
  expect(await counted(odd, 'org-a')).toBe(await uncached(odd))
  expect(countsKept()).toBe(kept + 6)
})

test('runs of one kind longer than the merge takes are cut in any script (the walk of the split and the count inside it, each with its own regex)', async () => {
  await loadTokenizer()
  const { countTokens: count } = await import('../../src/tokenizer.ts')
  const library = await import('../../src/tokenizer-tables.ts')
  const PLAIN = { disallowedSpecial: new Set<string>() }
  const between = ['Привет, мир. ', ' и ещё немного текста 東京 🙂 ', ' конец.']
  const runs = ['я'.repeat(300), 'ж'.repeat(500)]
  const text = between[0]! + runs[0]! + between[1]! + runs[1]! + between[2]!
  const exact = library.countTokens(text, PLAIN)
  const got = count(text)
  // At or above the exact count, and within the margin: 3 per chunk of at most 256 bytes of
  // UTF-8 (2 bytes a letter here) and 3 more per run.
  expect(got).toBeGreaterThanOrEqual(exact)
  const chunks = runs.reduce((n, r) => n + Math.ceil((r.length * 2) / 256), 0)
  expect(got).toBeLessThanOrEqual(exact + 3 * (chunks + runs.length))
})

test("counting's cache keeps no prompt alive: a long piece is kept as a copy, not as a view into its text", async () => {
  await loadTokenizer()
  const { countTokens: count } = await import('../../src/tokenizer.ts')
  const filler = 'routers queue requests while the nodes answer them in turn and bill each one once '
  const body = filler.repeat(Math.ceil(400_000 / filler.length))
  const rand = prng(41)
  const word = () =>
    Array.from({ length: 20 }, () => String.fromCharCode(97 + Math.floor(rand() * 26))).join('')
  Bun.gc(true)
  const before = process.memoryUsage().heapUsed
  // 40 prompts of 400 KB, each with a word of its own (a piece of 21 code units, a cache miss).
  for (let i = 0; i < 40; i++) count(`${body.slice(0, 1000)} ${word()}${body.slice(1000)}${i}`)
  Bun.gc(true)
  const grewMB = (process.memoryUsage().heapUsed - before) / 1e6
  // Kept as views, the pieces held every prompt: about 16 MB here.
  expect(grewMB).toBeLessThan(6)
})
