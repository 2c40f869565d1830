import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chatBody, closedLoop, openLoop, Pacer, runLoad, SseTokenCounter } from '../../bench/load.ts'

describe('Pacer', () => {
  test('request i is meant for start + i / rate', () => {
    const p = new Pacer(1000, 50, 100)
    expect(p.total).toBe(50)
    expect(p.intervalMs).toBe(1)
    expect(p.intendedAt(0)).toBe(100)
    expect(p.intendedAt(7)).toBe(107)
  })

  test('dueBy counts arrivals up to a time, capped at the total', () => {
    const p = new Pacer(200, 100, 0) // every 5 ms, 20 in all
    expect(p.dueBy(-1)).toBe(0)
    expect(p.dueBy(0)).toBe(1)
    expect(p.dueBy(4.9)).toBe(1)
    expect(p.dueBy(5)).toBe(2)
    expect(p.dueBy(12.5)).toBe(3)
    expect(p.dueBy(1e9)).toBe(20)
  })

  test('refuses a rate that is not positive', () => {
    expect(() => new Pacer(0, 100, 0)).toThrow()
  })
})

describe('openLoop', () => {
  test('sends at the intended times for a fixed rate', async () => {
    const sent: { at: number; intended: number; i: number }[] = []
    const r = await openLoop(
      { rate: 200, durationMs: 400, maxInFlight: 1000, drainMs: 1000 },
      async (i, intended) => {
        sent.push({ at: performance.now(), intended, i })
      },
    )
    expect(r.offered).toBe(80)
    expect(r.started).toBe(80)
    expect(r.unfinished).toBe(0)
    expect(sent.map((s) => s.i)).toEqual([...Array(80).keys()])
    for (let k = 1; k < sent.length; k++) expect(sent[k]!.intended - sent[k - 1]!.intended).toBeCloseTo(5, 6)
    // Never early; late by no more than timer slack (generous for a loaded CI machine).
    const lateness = sent.map((s) => s.at - s.intended).sort((a, b) => a - b)
    expect(lateness[0]!).toBeGreaterThanOrEqual(0)
    expect(lateness[Math.floor(lateness.length / 2)]!).toBeLessThan(5)
    // The whole schedule spans the duration, not the time the sends took.
    expect(sent[sent.length - 1]!.intended - sent[0]!.intended).toBeCloseTo(395, 6)
  })

  test('no coordinated omission: a saturated client still charges waiting to the request', async () => {
    // One request at a time, each taking 20 ms, offered every 10 ms: requests queue in the client.
    const latency: number[] = []
    const service: number[] = []
    await openLoop({ rate: 100, durationMs: 200, maxInFlight: 1, drainMs: 2000 }, async (_i, intended) => {
      const sentAt = performance.now()
      await Bun.sleep(20)
      const end = performance.now()
      service.push(end - sentAt)
      latency.push(end - intended)
    })
    expect(latency.length).toBe(20)
    // Measured from the send, every request looks like 20 ms...
    for (const s of service) expect(s).toBeLessThan(60)
    // ...but from the intended time the queue shows: request k waited about k * 10 ms.
    expect(latency[19]!).toBeGreaterThan(190)
    expect(latency[19]!).toBeGreaterThan(latency[0]! + 150)
  })

  test('no coordinated omission: a stalled event loop shows up as latency', async () => {
    const latency = new Map<number, number>()
    await openLoop({ rate: 100, durationMs: 300, maxInFlight: 1000, drainMs: 1000 }, async (i, intended) => {
      if (i === 0) {
        // Block the thread for 120 ms: requests 1..12 cannot go out on time.
        const until = performance.now() + 120
        while (performance.now() < until) {}
      }
      await Bun.sleep(1)
      latency.set(i, performance.now() - intended)
    })
    expect(latency.size).toBe(30)
    // Request 2 was meant for +20 ms and went out after +120 ms.
    expect(latency.get(2)!).toBeGreaterThan(95)
    expect(latency.get(6)!).toBeGreaterThan(55)
  })

  test('aborts what is unanswered when the drain time runs out', async () => {
    const r = await openLoop(
      { rate: 100, durationMs: 50, maxInFlight: 100, drainMs: 50 },
      (_i, _at, signal) => {
        return new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve()))
      },
    )
    expect(r.offered).toBe(5)
    expect(r.unfinished).toBe(5)
  })
})

describe('closedLoop', () => {
  test('keeps exactly `concurrency` requests in flight', async () => {
    let inFlight = 0
    let most = 0
    const r = await closedLoop({ concurrency: 3, durationMs: 100, drainMs: 1000 }, async () => {
      inFlight++
      most = Math.max(most, inFlight)
      await Bun.sleep(10)
      inFlight--
    })
    expect(most).toBe(3)
    expect(r.started).toBeGreaterThanOrEqual(15)
    expect(r.unfinished).toBe(0)
  })
})

describe('SseTokenCounter', () => {
  const ev = (delta: string) => `data: {"id":"x","choices":[{"index":0,"delta":${delta}}]}\n\n`

  test('counts content tokens across arbitrary chunk boundaries', () => {
    const text = ev('{"role":"assistant","content":""}') + ev('{"content":" a"}') + ev('{"content":" b"}')
    const c = new SseTokenCounter()
    let n = 0
    for (let i = 0; i < text.length; i += 7) n += c.push(text.slice(i, i + 7))
    expect(n).toBe(2)
    expect(c.sawDone).toBe(false)
    c.push('data: [DONE]\n\n')
    expect(c.sawDone).toBe(true)
  })

  test('reads the stamps of the tokens of each push', () => {
    const c = new SseTokenCounter()
    const stamped = (ms: string, delta: string) =>
      `data: {"id":"x","model":"m","x_sent_ms":${ms},"choices":[{"index":0,"delta":${delta}}]}\n\n`
    expect(
      c.push(stamped('1.5', '{"role":"assistant","content":""}') + stamped('2.25', '{"content":"a"}')),
    ).toBe(1)
    expect(c.stamps).toEqual([2.25])
    expect(c.push(stamped('1700000000123.456', '{"content":"b"}'))).toBe(1)
    expect(c.stamps).toEqual([1700000000123.456])
    c.push('data: [DONE]\n\n')
    expect(c.stamps).toEqual([])
  })

  test('notices an error event', () => {
    const c = new SseTokenCounter()
    c.push('data: {"error":{"message":"boom"}}\n\n')
    expect(c.sawError).toBe(true)
  })
})

describe('runLoad against a local server', () => {
  let server: ReturnType<typeof Bun.serve>
  beforeAll(() => {
    server = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      async fetch(req) {
        if (new URL(req.url).pathname !== '/v1/chat/completions') return new Response('no', { status: 404 })
        const body = (await req.json()) as { stream?: boolean; model?: string }
        if (!body.stream) return Response.json({ ok: true })
        const enc = new TextEncoder()
        if (body.model === 'stamped') {
          // Stamped 5 ms apart, as a node sends them; the second gap is held 20 ms more on the way.
          const stamp = () => (performance.timeOrigin + performance.now()).toFixed(3)
          const token = (i: number) =>
            `data: {"x_sent_ms":${stamp()},"choices":[{"delta":{"content":" w${i}"}}]}\n\n`
          const stream = new ReadableStream<Uint8Array>({
            async start(c) {
              c.enqueue(enc.encode(token(0)))
              await Bun.sleep(5)
              c.enqueue(enc.encode(token(1)))
              await Bun.sleep(5)
              const late = token(2)
              await Bun.sleep(20)
              c.enqueue(enc.encode(late))
              c.enqueue(enc.encode('data: [DONE]\n\n'))
              c.close()
            },
          })
          return new Response(stream, { headers: { 'content-type': 'text/event-stream' } })
        }
        const stream = new ReadableStream<Uint8Array>({
          async start(c) {
            c.enqueue(enc.encode('data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'))
            for (let i = 0; i < 3; i++) {
              await Bun.sleep(5)
              c.enqueue(enc.encode(`data: {"choices":[{"delta":{"content":" w${i}"}}]}\n\n`))
            }
            c.enqueue(enc.encode('data: [DONE]\n\n'))
            c.close()
          },
        })
        return new Response(stream, { headers: { 'content-type': 'text/event-stream' } })
      },
    })
  })
  afterAll(() => {
    server.stop(true)
  })
  const endpoint = () => ({ urls: [`http://127.0.0.1:${server.port}/v1/chat/completions`], headers: {} })

  test('open loop, JSON: every request answered and recorded after the warm-up', async () => {
    const r = await runLoad(endpoint(), chatBody('m', { stream: false, maxTokens: 4, seed: 1 }), {
      stream: false,
      warmupMs: 100,
      drainMs: 1000,
      open: { rate: 100, durationMs: 500, maxInFlight: 100 },
    })
    expect(r.ok).toBe(50)
    expect(r.errors).toBe(0)
    expect(r.total.count).toBeGreaterThanOrEqual(39)
    expect(r.total.count).toBeLessThanOrEqual(41)
    expect(r.ttfb.p50).toBeLessThanOrEqual(r.total.p50)
  })

  test('closed loop, SSE: time to first token and gaps between tokens', async () => {
    const r = await runLoad(endpoint(), chatBody('m', { stream: true, maxTokens: 4, seed: 1 }), {
      stream: true,
      warmupMs: 0,
      drainMs: 1000,
      closed: { concurrency: 2, durationMs: 200 },
    })
    expect(r.errors).toBe(0)
    expect(r.ok).toBeGreaterThan(2)
    // Three tokens per stream: two gaps of about 5 ms each.
    expect(r.itl.count).toBe(r.ok * 2)
    expect(r.itl.p50).toBeGreaterThanOrEqual(3)
    expect(r.ttft.p50).toBeGreaterThanOrEqual(3)
    expect(r.total.p50).toBeGreaterThanOrEqual(r.ttft.p50)
  })

  test('stamped chunks: what the way added to each gap, apart from the gaps the node made', async () => {
    const r = await runLoad(endpoint(), chatBody('stamped', { stream: true, maxTokens: 4, seed: 1 }), {
      stream: true,
      warmupMs: 0,
      drainMs: 1000,
      closed: { concurrency: 2, durationMs: 300 },
    })
    expect(r.errors).toBe(0)
    // Per stream two gaps: the first as sent (nothing added), the second held 20 ms.
    expect(r.addedGap.count).toBe(r.ok * 2)
    expect(r.addedGap.p50).toBeLessThan(10)
    expect(r.addedGap.p99).toBeGreaterThanOrEqual(18)
    // Unstamped streams have none.
    const plain = await runLoad(endpoint(), chatBody('m', { stream: true, maxTokens: 4, seed: 1 }), {
      stream: true,
      warmupMs: 0,
      drainMs: 1000,
      closed: { concurrency: 1, durationMs: 50 },
    })
    expect(plain.addedGap.count).toBe(0)
  })

  test('errors are counted with their reason', async () => {
    const r = await runLoad({ urls: [`http://127.0.0.1:${server.port}/nowhere`], headers: {} }, '{', {
      stream: false,
      warmupMs: 0,
      drainMs: 500,
      open: { rate: 50, durationMs: 100, maxInFlight: 10 },
    })
    expect(r.ok).toBe(0)
    expect(r.errors).toBe(5)
    expect(r.errorSamples[0]).toContain('5x')
  })
})
