import { emptySummary, LatencyHistogram, type LatencySummary } from './histogram.ts'

/**
 * The load generator: open loop (requests arrive at a fixed rate whatever the server does) and
 * closed loop (a fixed number of clients, each sending its next request when the previous one
 * ends), JSON or SSE, against any OpenAI-compatible chat endpoint.
 *
 * Open-loop latency is measured from the time a request was *meant* to be sent, not from when
 * the client got round to sending it: a stalled server (or a stalled client) then shows up as
 * latency of every request that should have gone out meanwhile, instead of silently thinning the
 * sample (coordinated omission).
 */

export type Clock = () => number

/** Where requests go: one or more full URLs used round-robin, and the headers to send. */
export interface Endpoint {
  readonly urls: readonly string[]
  readonly headers: Readonly<Record<string, string>>
}

/** Fixed-rate arrivals: request i is meant to be sent at start + i / rate. */
export class Pacer {
  readonly intervalMs: number
  readonly total: number

  constructor(
    readonly rate: number,
    durationMs: number,
    readonly startMs: number,
  ) {
    if (!(rate > 0)) throw new Error(`rate must be positive, not ${rate}`)
    this.intervalMs = 1000 / rate
    this.total = Math.max(1, Math.floor((durationMs * rate) / 1000))
  }

  intendedAt(i: number): number {
    return this.startMs + i * this.intervalMs
  }

  /** How many requests should have been sent by `nowMs` (the first one is due at start). */
  dueBy(nowMs: number): number {
    if (nowMs < this.startMs) return 0
    return Math.min(this.total, Math.floor((nowMs - this.startMs) / this.intervalMs) + 1)
  }
}

/** Sends one request; `intendedAt` is the time latency is measured from. */
export type Fire = (index: number, intendedAt: number, signal: AbortSignal) => Promise<void>

export interface ScheduleResult {
  offered: number
  started: number
  /** Requests still unanswered when the drain time ran out; they were aborted. */
  unfinished: number
  /** How late the latest send was against its intended time, ms (client-side lag). */
  maxSendLagMs: number
  elapsedMs: number
}

export interface OpenLoopOptions {
  rate: number
  durationMs: number
  /** Requests in flight at most; beyond it arrivals queue in the client (and their wait counts). */
  maxInFlight: number
  /** After the last arrival, how long to wait for answers before aborting them. */
  drainMs: number
  clock?: Clock
}

/**
 * Open loop: fires request i at its intended time (several per wake-up at high rates, since
 * timers are coarser than the interval). When `maxInFlight` is reached, due requests wait for a
 * free slot and are sent late; the `Fire` callback still measures from the intended time.
 */
export async function openLoop(opts: OpenLoopOptions, fire: Fire): Promise<ScheduleResult> {
  const now = opts.clock ?? (() => performance.now())
  const pacer = new Pacer(opts.rate, opts.durationMs, now())
  const abort = new AbortController()
  let next = 0
  let inFlight = 0
  let maxLag = 0
  let slotFreed: (() => void) | undefined
  let allDone: (() => void) | undefined
  const done = () => {
    inFlight--
    slotFreed?.()
    slotFreed = undefined
    if (inFlight === 0) allDone?.()
  }
  while (next < pacer.total) {
    const t = now()
    const due = pacer.dueBy(t)
    while (next < due && inFlight < opts.maxInFlight) {
      const i = next++
      const at = pacer.intendedAt(i)
      if (t - at > maxLag) maxLag = t - at
      inFlight++
      fire(i, at, abort.signal).then(done, done)
    }
    if (next >= pacer.total) break
    if (next < due) {
      // Saturated: wait for any answer rather than spin.
      await new Promise<void>((resolve) => {
        slotFreed = resolve
      })
    } else {
      await sleepUntil(pacer.intendedAt(next), now)
    }
  }
  const drained = new Promise<void>((resolve) => {
    allDone = resolve
    if (inFlight === 0) resolve()
  })
  await Promise.race([drained, Bun.sleep(opts.drainMs)])
  const unfinished = inFlight
  if (unfinished > 0) {
    abort.abort(new Error('drain time ran out'))
    // Aborted requests settle (and count their errors) within a few turns.
    await Promise.race([drained, Bun.sleep(1000)])
  }
  return {
    offered: pacer.total,
    started: next,
    unfinished,
    maxSendLagMs: maxLag,
    elapsedMs: now() - pacer.startMs,
  }
}

export interface ClosedLoopOptions {
  concurrency: number
  durationMs: number
  drainMs: number
  clock?: Clock
}

/** Closed loop: `concurrency` clients, each sending its next request when its last one ends. */
export async function closedLoop(opts: ClosedLoopOptions, fire: Fire): Promise<ScheduleResult> {
  const now = opts.clock ?? (() => performance.now())
  const start = now()
  const end = start + opts.durationMs
  const abort = new AbortController()
  let started = 0
  let finished = 0
  const worker = async () => {
    while (now() < end) {
      const i = started++
      await fire(i, now(), abort.signal)
      finished++
    }
  }
  const workers = Promise.all(Array.from({ length: opts.concurrency }, worker))
  const deadline = Bun.sleep(opts.durationMs + opts.drainMs).then(() => 'late' as const)
  if ((await Promise.race([workers, deadline])) === 'late') abort.abort(new Error('drain time ran out'))
  return {
    offered: started,
    started,
    unfinished: started - finished,
    maxSendLagMs: 0,
    elapsedMs: now() - start,
  }
}

async function sleepUntil(atMs: number, now: Clock): Promise<void> {
  // Never less than a millisecond: spinning on zero-delay timers at high rates would burn a core
  // the contestants need (2-core machines). Requests due meanwhile go out together on waking,
  // and their latency still counts from their intended times.
  await Bun.sleep(Math.max(1, atMs - now()))
}

/** Counts the content tokens of an OpenAI chat SSE stream as its bytes arrive. */
export class SseTokenCounter {
  sawDone = false
  sawError = false
  /** The `x_sent_ms` stamps (the simulator's `stampChunks`) of the tokens of the last push. */
  readonly stamps: number[] = []
  private buffer = ''

  /** Feeds decoded text; returns how many content tokens completed in it. */
  push(text: string): number {
    this.stamps.length = 0
    this.buffer += text
    let tokens = 0
    let start = 0
    for (;;) {
      const end = this.buffer.indexOf('\n\n', start)
      if (end < 0) break
      tokens += this.event(this.buffer.slice(start, end))
      start = end + 2
    }
    if (start > 0) this.buffer = this.buffer.slice(start)
    return tokens
  }

  private event(ev: string): number {
    if (!ev.startsWith('data:')) return 0
    if (ev.includes('[DONE]')) {
      this.sawDone = true
      return 0
    }
    if (ev.includes('"error"') && /^data: ?\{\s*"error"/.test(ev)) {
      this.sawError = true
      return 0
    }
    // A token is a delta with non-empty content; the role-only first chunk has "content":"".
    const at = ev.indexOf('"content":"')
    if (at < 0 || ev.charCodeAt(at + 11) === 34) return 0
    const s = ev.indexOf('"x_sent_ms":')
    if (s >= 0) this.stamps.push(Number.parseFloat(ev.slice(s + 12, s + 40)))
    return 1
  }
}

/** Latency series of one run, all in ms. */
export interface LoadStats {
  /** Until the whole answer has arrived (JSON read, or [DONE]). */
  total: LatencySummary
  /** Until the response headers. */
  ttfb: LatencySummary
  /** Streams: until the first content token. */
  ttft: LatencySummary
  /** Streams: gaps between consecutive content tokens as the client sees them. */
  itl: LatencySummary
  /**
   * Streams from stamped nodes: how much longer each gap between consecutive tokens was at the
   * client than at the node that sent them (0 when shorter): the inter-token latency the path
   * added, free of the node's own jitter. Empty when the chunks carry no stamps.
   */
  addedGap: LatencySummary
}

export interface LoadResult extends ScheduleResult, LoadStats {
  mode: 'open' | 'closed'
  stream: boolean
  rate: number | null
  concurrency: number | null
  /** Answered completely with 2xx (counted after the warm-up as well as during it). */
  ok: number
  errors: number
  /** A few distinct error texts, to say why a run failed. */
  errorSamples: string[]
  achievedRps: number
}

export interface LoadOptions {
  stream: boolean
  /** Samples meant to be sent in the first `warmupMs` are not recorded. */
  warmupMs: number
  /** After the schedule ends, how long answers may take before they are aborted as errors. */
  drainMs: number
  open?: { rate: number; durationMs: number; maxInFlight: number }
  closed?: { concurrency: number; durationMs: number }
}

const decoder = new TextDecoder()

/** Runs one load test against an endpoint with a fixed JSON body. */
export async function runLoad(endpoint: Endpoint, body: string, opts: LoadOptions): Promise<LoadResult> {
  if (endpoint.urls.length === 0) throw new Error('endpoint has no URLs')
  const total = new LatencyHistogram()
  const ttfb = new LatencyHistogram()
  const ttft = new LatencyHistogram()
  const itl = new LatencyHistogram()
  const addedGap = new LatencyHistogram()
  const headers = { 'content-type': 'application/json', ...endpoint.headers }
  const errors = new Map<string, number>()
  let ok = 0
  let failed = 0
  let rr = 0
  let recordFrom = Number.POSITIVE_INFINITY
  const fail = (why: string) => {
    failed++
    errors.set(why, (errors.get(why) ?? 0) + 1)
  }

  const fire: Fire = async (_index, intendedAt, runSignal) => {
    const url = endpoint.urls[rr++ % endpoint.urls.length]!
    const record = intendedAt >= recordFrom
    try {
      // One run-wide signal: a timer and a composite signal per request would cost the client
      // more CPU than the proxies it measures at high rates; the drain deadline bounds a request.
      const res = await fetch(url, { method: 'POST', headers, body, signal: runSignal })
      const tHead = performance.now()
      if (!res.ok) {
        fail(`HTTP ${res.status}: ${(await res.text()).slice(0, 160)}`)
        return
      }
      if (!opts.stream) {
        await res.arrayBuffer()
        const tEnd = performance.now()
        ok++
        if (record) {
          ttfb.recordMs(tHead - intendedAt)
          total.recordMs(tEnd - intendedAt)
        }
        return
      }
      const counter = new SseTokenCounter()
      const gaps: number[] = []
      const added: number[] = []
      let first = -1
      let last = -1
      let lastDelay = Number.NaN
      const reader = res.body!.getReader()
      for (;;) {
        const { done, value } = await reader.read()
        if (done) break
        const t = performance.now()
        const n = counter.push(decoder.decode(value, { stream: true }))
        for (let k = 0; k < n; k++) {
          if (first < 0) first = t
          else gaps.push(k === 0 ? t - last : 0)
          last = t
        }
        // Stamped: each token's delay from the node to here; a gap grew by the change in delay.
        for (const sent of counter.stamps) {
          const delay = performance.timeOrigin + t - sent
          if (!Number.isNaN(lastDelay)) added.push(Math.max(0, delay - lastDelay))
          lastDelay = delay
        }
      }
      const tEnd = performance.now()
      if (!counter.sawDone || counter.sawError || first < 0) {
        fail(counter.sawError ? 'error event in stream' : 'stream ended without [DONE]')
        return
      }
      ok++
      if (record) {
        ttfb.recordMs(tHead - intendedAt)
        ttft.recordMs(first - intendedAt)
        total.recordMs(tEnd - intendedAt)
        for (const g of gaps) itl.recordMs(g)
        for (const g of added) addedGap.recordMs(g)
      }
    } catch (err) {
      const e = err as Error
      fail(runSignal.aborted ? 'unanswered when the drain time ran out' : `${e.name}: ${e.message}`)
    }
  }

  const t0 = performance.now()
  recordFrom = t0 + opts.warmupMs
  let sched: ScheduleResult
  let mode: 'open' | 'closed'
  if (opts.open) {
    mode = 'open'
    sched = await openLoop({ ...opts.open, drainMs: opts.drainMs }, fire)
  } else if (opts.closed) {
    mode = 'closed'
    sched = await closedLoop({ ...opts.closed, drainMs: opts.drainMs }, fire)
  } else throw new Error('runLoad needs open or closed options')
  const measuredMs = Math.max(1, sched.elapsedMs - opts.warmupMs)
  return {
    ...sched,
    mode,
    stream: opts.stream,
    rate: opts.open?.rate ?? null,
    concurrency: opts.closed?.concurrency ?? null,
    ok,
    errors: failed,
    errorSamples: [...errors.entries()].slice(0, 5).map(([why, n]) => `${n}x ${why}`),
    achievedRps: (total.count * 1000) / measuredMs,
    total: total.summary(),
    ttfb: ttfb.summary(),
    ttft: opts.stream ? ttft.summary() : emptySummary(),
    itl: opts.stream ? itl.summary() : emptySummary(),
    addedGap: opts.stream ? addedGap.summary() : emptySummary(),
  }
}

/** A chat request body: a short prompt and a fixed seed, so every contestant gets the same answer. */
export function chatBody(model: string, opts: { stream: boolean; maxTokens: number; seed: number }): string {
  return JSON.stringify({
    model,
    messages: [{ role: 'user', content: 'Say something short about routers and queues.' }],
    max_tokens: opts.maxTokens,
    seed: opts.seed,
    stream: opts.stream,
  })
}
