import { type Endpoint, SseTokenCounter } from './load.ts'
import { type Memory, memoryOf } from './proc.ts'

/**
 * Many concurrent open streams, to weigh a process: open `n` SSE streams at a bounded rate
 * against a slow fleet (a token every second or so), wait until every one has its first token,
 * hold them while sampling the process's resident memory, then cancel them all.
 */

export interface HoldOptions {
  n: number
  /** New streams per second while ramping up (a burst of thousands would overflow accept queues). */
  rampPerSec: number
  /** Give up waiting for first tokens after this long. */
  openTimeoutMs: number
  /** How long to hold every stream open once all are flowing. */
  holdMs: number
  /** The process whose memory is sampled. */
  pid: number
  sampleEveryMs: number
}

export interface HoldResult {
  requested: number
  /** Streams that delivered a first token. */
  opened: number
  failed: number
  errorSamples: string[]
  /** From the first request to the last first token, ms. */
  openMs: number
  /** Resident memory just before the first stream. */
  before: Memory | undefined
  /** Highest VmRSS sampled while the streams were opening and held, KiB. */
  peakRssKiB: number
  /** VmHWM after the hold (the process's lifetime peak), KiB. */
  hwmKiB: number
}

const decoder = new TextDecoder()

export async function holdStreams(endpoint: Endpoint, body: string, o: HoldOptions): Promise<HoldResult> {
  const headers = { 'content-type': 'application/json', ...endpoint.headers }
  const abort = new AbortController()
  const before = memoryOf(o.pid)
  let peak = before?.rssKiB ?? 0
  const sample = () => {
    const m = memoryOf(o.pid)
    if (m && m.rssKiB > peak) peak = m.rssKiB
  }
  const sampler = setInterval(sample, o.sampleEveryMs)
  const errors = new Map<string, number>()
  let opened = 0
  let failed = 0
  let allOpen: (() => void) | undefined
  const settledOpen = () => {
    if (opened + failed >= o.n) allOpen?.()
  }
  const fail = (why: string) => {
    failed++
    errors.set(why, (errors.get(why) ?? 0) + 1)
    settledOpen()
  }

  const one = async (i: number) => {
    let firstSeen = false
    try {
      const url = endpoint.urls[i % endpoint.urls.length]!
      const res = await fetch(url, { method: 'POST', headers, body, signal: abort.signal })
      if (!res.ok) return fail(`HTTP ${res.status}: ${(await res.text()).slice(0, 160)}`)
      const counter = new SseTokenCounter()
      const reader = res.body!.getReader()
      for (;;) {
        const { done, value } = await reader.read()
        if (done) break
        if (!firstSeen && counter.push(decoder.decode(value, { stream: true })) > 0) {
          firstSeen = true
          opened++
          settledOpen()
        }
      }
      // A stream that ends before we cancel it was too short for the test: say so.
      if (!firstSeen) fail('stream ended before its first token')
      else if (!abort.signal.aborted) errors.set('ended early', (errors.get('ended early') ?? 0) + 1)
    } catch (err) {
      if (!firstSeen && !abort.signal.aborted) fail(`${(err as Error).name}: ${(err as Error).message}`)
      else if (!firstSeen) fail('not open when cancelled')
    }
  }

  const t0 = performance.now()
  const all: Promise<void>[] = []
  const everyOpen = new Promise<void>((resolve) => {
    allOpen = resolve
  })
  const batch = Math.max(1, Math.round(o.rampPerSec / 50))
  for (let i = 0; i < o.n; i += batch) {
    for (let k = i; k < Math.min(o.n, i + batch); k++) all.push(one(k))
    await Bun.sleep(20)
  }
  await Promise.race([everyOpen, Bun.sleep(o.openTimeoutMs)])
  const openMs = performance.now() - t0
  await Bun.sleep(o.holdMs)
  sample()
  clearInterval(sampler)
  const hwm = memoryOf(o.pid)?.hwmKiB ?? 0
  abort.abort(new Error('test over'))
  await Promise.race([Promise.all(all), Bun.sleep(10_000)])
  return {
    requested: o.n,
    opened,
    failed,
    errorSamples: [...errors.entries()].slice(0, 5).map(([why, n]) => `${n}x ${why}`),
    openMs,
    before,
    peakRssKiB: peak,
    hwmKiB: hwm,
  }
}
