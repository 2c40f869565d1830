import { expect, test } from 'bun:test'
import { KINDS, splitEvents, type TranslateReport } from '../../bench/translate.ts'
import { runBenchScript } from '../helpers/bench-script.ts'

/**
 * `bun bench/translate.ts --quick`: every provider's adapter answers the recorded exchange in
 * OpenAI's form (the script throws otherwise) and the report has every figure. No speed figure is
 * asserted (machines vary).
 */
test(
  'the translation benchmark runs every provider against the pass-through and reports each figure',
  async () => {
    const { out, json: r } = await runBenchScript<TranslateReport>(['bench/translate.ts', '--quick'])
    expect(out).toContain('Translated request')
    expect(out).toContain('Translated stream')
    expect(r.kinds.map((k) => k.kind)).toEqual([...KINDS])
    for (const k of r.kinds) {
      expect(k.request.n).toBe(r.requestsPerKind)
      expect(Number.isFinite(k.request.p50) && k.request.p50 > 0).toBe(true)
      // Every stream was read through to many events (one per token and then some).
      expect(k.stream.events).toBeGreaterThanOrEqual(r.streamsPerKind * r.tokensPerStream)
      expect(Number.isFinite(k.stream.addedP50)).toBe(true)
    }
    expect(r.kinds[0]!.request.addedP50).toBe(0)
  },
  { timeout: 60_000 },
)

test('a recorded body is cut into the events an upstream writes: SSE events, or JSON lines', () => {
  const enc = new TextEncoder()
  const dec = (xs: Uint8Array[]) => xs.map((x) => new TextDecoder().decode(x))
  expect(dec(splitEvents(enc.encode('data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n')))).toEqual([
    'data: {"a":1}\n\n',
    'data: {"b":2}\n\n',
    'data: [DONE]\n\n',
  ])
  expect(dec(splitEvents(enc.encode('data: {"a":1}\r\n\r\ndata: {"b":2}\r\n\r\n')))).toEqual([
    'data: {"a":1}\r\n\r\n',
    'data: {"b":2}\r\n\r\n',
  ])
  expect(dec(splitEvents(enc.encode('{"result":1}\n{"result":2}\n')))).toEqual([
    '{"result":1}\n',
    '{"result":2}\n',
  ])
})
