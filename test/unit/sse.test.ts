import { expect, test } from 'bun:test'
import { prng } from '../../src/simulator/text.ts'
import { ChatStreamRelay, deltaText, TEXT_COMPLETION_STREAM, utf8Whole } from '../../src/upstream/sse.ts'

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

test('a long stream keeps its generated text, not every chunk it relayed', () => {
  const head = `{"id":"chatcmpl-up","object":"chat.completion.chunk","created":1,"model":"up","choices":[`
  const chunk = (n: number) => {
    let s = ''
    for (let i = 0; i < n; i++)
      s += `data: ${head}{"index":0,"delta":{"content":" w${i % 10}"},"logprobs":null,"finish_reason":null}]}\n\n`
    return new TextEncoder().encode(s)
  }
  Bun.gc(true)
  const before = process.memoryUsage()
  const relays: ChatStreamRelay[] = []
  // 20 streams of ~4 MB of events each: ~80 MB relayed, ~1.2 MB of generated text
  for (let r = 0; r < 20; r++) {
    const relay = new ChatStreamRelay('chatcmpl-x', 'test/m', false, () => ({
      prompt_tokens: 0,
      completion_tokens: 0,
    }))
    for (let k = 0; k < 60; k++) relay.push(chunk(340))
    relays.push(relay)
  }
  Bun.gc(true)
  const after = process.memoryUsage()
  const heldMB = (after.heapUsed + after.external - before.heapUsed - before.external) / 1e6
  expect(relays.every((r) => r.generated.length === 60 * 340 * 3)).toBe(true)
  // Before, each stream held every decoded chunk: ~200 MB here.
  expect(heldMB).toBeLessThan(40)
})

test("Azure's opening prompt-filter event, in either key order and with usage null, is relayed under Tropa's id as a chat.completion.chunk; the upstream's id is learnt from the next event", () => {
  const openings = [
    '{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}',
    '{"id":"","object":"","created":0,"model":"","prompt_annotations":[{"prompt_index":0,"content_filter_results":{}}],"choices":[],"usage":null}',
  ]
  for (const opening of openings) {
    const relay = new ChatStreamRelay('chatcmpl-tropa', 'azure/m', false, () => ({
      prompt_tokens: 1,
      completion_tokens: 1,
    }))
    const chunk = (content: string) =>
      `data: {"id":"chatcmpl-up1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"finish_reason":null,"delta":{"content":"${content}"}}],"usage":null}\n\n`
    const events: { id: string; object: string; created: number; model: string; choices: unknown[] }[] =
      relayed(relay, `data: ${opening}\n\n${chunk('Hel')}${chunk('lo')}`).sent
    expect(events).toHaveLength(3)
    expect(events.map((e) => e.id)).toEqual(['chatcmpl-tropa', 'chatcmpl-tropa', 'chatcmpl-tropa'])
    expect(events.map((e) => e.model)).toEqual(['azure/m', 'azure/m', 'azure/m'])
    // Azure's empty "object" and zero "created" are not passed on: every chunk is a chunk.
    expect(events.map((e) => e.object)).toEqual(Array(3).fill('chat.completion.chunk'))
    expect(events[0]!.created).toBeGreaterThan(1_700_000_000)
    expect(events[0]!.choices).toEqual([])
    expect(relay.generated).toBe('Hello')
  }
})

test('a legacy completions stream: ids and model swapped, choices’ text kept (not logprobs’ tokens), usage written as a text_completion at [DONE]', () => {
  const head = '{"id":"cmpl-up","object":"text_completion","created":1,"model":"up","choices":['
  const logprobs =
    '{"tokens":[" text"],"token_logprobs":[-0.1],"top_logprobs":[{"text":-0.1}],"text_offset":[0]}'
  const events = [
    `data: ${head}{"index":0,"text":" one","logprobs":${logprobs},"finish_reason":null}]}\n\n`,
    `data: ${head}{"index":1,"text":" two \\"quoted\\"","logprobs":null,"finish_reason":"length"}],"usage":null}\n\n`,
    'data: [DONE]\n\n',
  ]
  let shown: unknown
  const relay = new ChatStreamRelay(
    'cmpl-tropa',
    'test/m',
    true,
    (usage) => {
      shown = usage
      return { prompt_tokens: 3, completion_tokens: 4, estimated: true }
    },
    TEXT_COMPLETION_STREAM,
  )
  const out = relay.push(new TextEncoder().encode(events.join(''))) ?? ''
  expect(relay.generated).toBe(' one two "quoted"')
  expect(shown).toBeUndefined()
  const sent = out.split('\n\n').filter(Boolean)
  expect(sent.at(-1)).toBe('data: [DONE]')
  const chunks = sent.slice(0, -1).map((e) => JSON.parse(e.slice(6)))
  for (const c of chunks)
    expect([c.id, c.model, c.object]).toEqual(['cmpl-tropa', 'test/m', 'text_completion'])
  expect(chunks.at(-1).usage).toEqual({ prompt_tokens: 3, completion_tokens: 4, estimated: true })
  expect(chunks.at(-1).choices).toEqual([])
})

test("the upstream's id and model are swapped for Tropa's whichever comes first in a chunk, the first of each only, and a chunk without one keeps the other swapped", () => {
  const relay = new ChatStreamRelay('chatcmpl-tropa', 'test/m', false, () => ({
    prompt_tokens: 1,
    completion_tokens: 1,
  }))
  const events = [
    // learnt from the first event
    'data: {"id":"up-1","model":"up/m","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
    // model first; the id's value again inside a tool call (not the first: kept)
    'data: {"model":"up/m","id":"up-1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"up-1","function":{"name":"f","arguments":"{}"}}]}}]}\n\n',
    // id only, then model only
    'data: {"id":"up-1","choices":[{"index":0,"delta":{"content":"b"}}]}\n\n',
    'data: {"choices":[{"index":0,"delta":{"content":"c"}}],"model":"up/m"}\n\n',
    // neither
    'data: {"choices":[{"index":0,"delta":{"content":"d"}}]}\n\n',
  ]
  const { out, sent } = relayed(relay, events.join(''))
  expect(sent.map((c) => [c.id, c.model])).toEqual([
    ['chatcmpl-tropa', 'test/m'],
    ['chatcmpl-tropa', 'test/m'],
    ['chatcmpl-tropa', undefined],
    [undefined, 'test/m'],
    [undefined, undefined],
  ])
  expect(sent[1].choices[0].delta.tool_calls[0].id).toBe('up-1')
  // Nothing but the two strings changed: the key order and every other byte are the upstream's.
  expect(out).toBe(
    events
      .join('')
      .replaceAll('"id":"up-1","model":"up/m"', '"id":"chatcmpl-tropa","model":"test/m"')
      .replace('"model":"up/m","id":"up-1"', '"model":"test/m","id":"chatcmpl-tropa"')
      .replace('{"id":"up-1","choices"', '{"id":"chatcmpl-tropa","choices"')
      .replace('"model":"up/m"}', '"model":"test/m"}'),
  )
  expect(relay.generated).toBe('af{}bcd')
})

test('ids with `$` in them are written as they are, not read as replacement patterns (config allows none; the relay does not rely on it)', () => {
  const relay = new ChatStreamRelay('chatcmpl-$&', 'team/$1-$&-m', false, () => ({
    prompt_tokens: 1,
    completion_tokens: 1,
  }))
  const event = 'data: {"id":"up-1","model":"up/m","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
  const { sent } = relayed(relay, event + event)
  expect(sent.map((c) => [c.id, c.model])).toEqual([
    ['chatcmpl-$&', 'team/$1-$&-m'],
    ['chatcmpl-$&', 'team/$1-$&-m'],
  ])
})

/** What the relay sends for `text` pushed as one chunk, and its events' JSON. */
function relayed(relay: ChatStreamRelay, text: string) {
  const out = relay.push(new TextEncoder().encode(text)) ?? ''
  const sent = out
    .split('\n\n')
    .filter(Boolean)
    .map((e) => JSON.parse(e.slice(6)))
  return { out, sent }
}

test('the generated text is exact however the events come: read in batches, across chunk splits, escapes, tool calls and usage on every chunk', () => {
  const head = `{"id":"chatcmpl-up","object":"chat.completion.chunk","created":1,"model":"up"`
  const pieces: string[] = []
  let events = ''
  for (let i = 0; i < 400; i++) {
    const text = i % 7 === 0 ? ` "q${i}"\n\\é` : ` w${i}`
    pieces.push(text)
    const delta =
      i % 5 === 0 ? { tool_calls: [{ index: 0, function: { arguments: text } }] } : { content: text }
    // vLLM's continuous usage: a cumulative usage on every chunk, choices not empty
    const usage = i % 3 === 0 ? `,"usage":{"prompt_tokens":3,"completion_tokens":${i + 1}}` : ',"usage":null'
    events += `data: ${head},"choices":[{"index":0,"delta":${JSON.stringify(delta)},"finish_reason":null}]${usage}}\n\n`
  }
  events += 'data: [DONE]\n\n'
  const bytes = new TextEncoder().encode(events)
  const rand = prng(5)
  let billed: unknown = 'not called'
  const relay = new ChatStreamRelay('chatcmpl-x', 'test/m', false, (u) => {
    billed = u
    return { prompt_tokens: 0, completion_tokens: 0 }
  })
  let out = ''
  for (let at = 0; at < bytes.length; ) {
    const end = Math.min(bytes.length, at + 1 + Math.floor(rand() * 700))
    const got = relay.push(bytes.subarray(at, end))
    if (got) out += got
    at = end
  }
  expect(relay.generated).toBe(pieces.join(''))
  // The last cumulative usage is what the stream ends with when no final usage event came.
  expect(billed).toEqual({ prompt_tokens: 3, completion_tokens: 400 })
  expect(out.split('\n\n').filter((e) => e.startsWith('data: {')).length).toBe(400)
  expect(out.includes('chatcmpl-up')).toBe(false)
})

test('an event an upstream left unterminated adds no text, and takes none from the next event read with it', () => {
  const head = `{"id":"chatcmpl-up","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{"content":`
  const relay = new ChatStreamRelay('chatcmpl-x', 'test/m', false, () => ({
    prompt_tokens: 0,
    completion_tokens: 0,
  }))
  const events = [`${head}"Hello"}}]}`, `${head}"trunc`, `${head}"tail \\`, `${head}" world"}}]}`]
  relay.push(new TextEncoder().encode(events.map((e) => `data: ${e}\n\n`).join('')))
  expect(relay.generated).toBe('Hello world')
})

test('utf8Whole cuts before a character whose bytes a chunk ends in the middle of, and nowhere else', () => {
  const bytes = (s: string) => new TextEncoder().encode(s)
  expect(utf8Whole(bytes('abc'))).toBe(3)
  for (const ch of ['é', 'ж', '世', '🙂']) {
    const b = bytes(`a${ch}`)
    expect(utf8Whole(b)).toBe(b.length)
    for (let cut = 2; cut < b.length; cut++) expect(utf8Whole(b.subarray(0, cut))).toBe(1)
  }
  expect(utf8Whole(new Uint8Array(0))).toBe(0)
})

test('a stream of 2-, 3- and 4-byte characters relayed a byte at a time is relayed whole; a BOM is dropped at the start only', () => {
  const head = `{"id":"chatcmpl-up","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{"content":`
  const texts = [' é', ' жизнь', ' 世界', ' 🙂🙃', ' \ufeff kept']
  let events = ''
  for (const t of texts) events += `data: ${head}${JSON.stringify(t)}},"finish_reason":null}]}\n\n`
  events += 'data: [DONE]\n\n'
  const bytes = new TextEncoder().encode(`\ufeff${events}`)
  const relay = new ChatStreamRelay('chatcmpl-x', 'test/m', false, () => ({
    prompt_tokens: 0,
    completion_tokens: 0,
  }))
  let out = ''
  for (let at = 0; at < bytes.length; at++) out += relay.push(bytes.subarray(at, at + 1)) ?? ''
  out += relay.end() ?? ''
  expect(relay.generated).toBe(texts.join(''))
  expect(out.startsWith('data: {"id":"chatcmpl-x"')).toBe(true)
  expect(out).toContain('🙂🙃')
  expect(out.includes('\ufffd')).toBe(false)
})

test("a relay fed Buffers (views of a socket's reads) decodes as a stream decoder does: invalid bytes and a character left unfinished at the end become U+FFFD", () => {
  const head = `data: {"id":"chatcmpl-up","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{"content":"`
  const tail = '"},"finish_reason":null}]}\n\n'
  const enc = new TextEncoder()
  // 0xFF, a lone lead byte (0xC0) and an overlong start (0xE0 0x80) inside the text, then a
  // 4-byte character cut after two bytes where the upstream closes.
  const bytes = Buffer.concat([
    enc.encode(`${head}a`),
    Buffer.from([0xff, 0x62, 0xc0, 0x63, 0xe0, 0x80, 0x64]),
    enc.encode(`ж🙂${tail}${head}e`),
    Buffer.from([0xf0, 0x9f]),
  ])
  const expected = new TextDecoder().decode(bytes)
  for (const size of [1, 2, 3, 5, 64]) {
    const relay = new ChatStreamRelay('chatcmpl-x', 'test/m', false, () => ({
      prompt_tokens: 0,
      completion_tokens: 0,
    }))
    // A Buffer over a larger allocation, as a socket read is.
    const socket = Buffer.concat([Buffer.alloc(7), bytes, Buffer.alloc(9)]).subarray(7, 7 + bytes.length)
    let out = ''
    for (let at = 0; at < socket.length; at += size) out += relay.push(socket.subarray(at, at + size)) ?? ''
    out += relay.end() ?? ''
    // (The relay ends the unterminated last event with its blank line.)
    expect(out.replaceAll('chatcmpl-x', 'chatcmpl-up').replaceAll('test/m', 'up')).toBe(`${expected}\n\n`)
    expect(out.endsWith('\ufffd\n\n')).toBe(true)
  }
})
