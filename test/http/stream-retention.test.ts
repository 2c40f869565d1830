import { heapStats } from 'bun:jsc'
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { startTropa, type Tropa } from '../helpers/start.ts'

// What an open stream keeps (issue #24, bench/results/2026-11-28k): the router runs in this
// process, so its heap is this heap. A node answering a token a second keeps the streams open.
let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    nodes: [{ name: 'slow', timeScale: 1, itlMs: 1000, maxSeqs: 256 }],
    upstream: { idle_timeout_ms: 30_000 },
  })
})
afterAll(() => t.stop())

const counts = () => {
  Bun.gc(true)
  return heapStats().objectTypeCounts
}

test("an open stream keeps no web stream of its request's body, no TextDecoder and no AbortController", async () => {
  const n = 40
  const before = counts()
  const abort = new AbortController()
  const readers = await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const res = await t.fetch('/v1/chat/completions', {
        method: 'POST',
        signal: abort.signal,
        body: JSON.stringify({
          model: 'test/chat',
          messages: [{ role: 'user', content: `hold ${i}` }],
          max_tokens: 60,
          stream: true,
        }),
      })
      expect(res.status).toBe(200)
      const reader = res.body!.getReader()
      // The first token is relayed: the stream is past dispatch, in its relay.
      await reader.read()
      return reader
    }),
  )
  const open = counts()
  const grew = (type: string) => ((open[type] ?? 0) - (before[type] ?? 0)) / n
  try {
    // The client's side of these streams (this process's fetch) holds objects of its own: one
    // body source a stream, about 19 closures. The router's side held one more body source, a
    // TextDecoder and an AbortController a stream before 2026-11-28k (read then: 2, 1.05, 1.03),
    // and none after (1, 0.05, 0.03).
    expect(grew('BytesInternalReadableStreamSource')).toBeLessThan(1.5)
    expect(grew('TextDecoder')).toBeLessThan(0.5)
    expect(grew('AbortController')).toBeLessThan(0.5)
    // And the relay's state is one object, not a scope of closures: 36.3 a stream with the
    // client's before, 28.3 after.
    expect(grew('Function')).toBeLessThan(32)
  } finally {
    abort.abort()
    await Promise.allSettled(readers.map((r) => r.cancel()))
  }
})

test('a caller without a valid key gets its 401 while its body is still arriving: nothing of it was read', async () => {
  let sent = 0
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      // One chunk, then the body never ends.
      if (sent++ === 0) controller.enqueue(new TextEncoder().encode('{"model":"test/chat","messages":['))
      else return new Promise(() => {})
    },
  })
  const res = await fetch(`${t.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: 'Bearer sk-not-a-key', 'content-type': 'application/json' },
    body,
    signal: AbortSignal.timeout(20_000),
  })
  expect(res.status).toBe(401)
  expect(((await res.json()) as { error: { code: string } }).error.code).toBe('invalid_api_key')
})
