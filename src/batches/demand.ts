/** Arrivals are counted over this window by default: a change of the arrival rate shows within it. */
const WINDOW_MS = 500
/** The longest window arrivals may be counted over (`load`'s `windowMs`); older ones are dropped. */
const MAX_WINDOW_MS = 1_000
/** Time in flight per request is averaged over about this long. */
const LONG_MS = 10_000
/** Fewer arrivals than this (decayed) over the long window: the time in flight is not known yet. */
const MIN_ARRIVALS = 20
/**
 * Nor before this long since the first observation: requests first seen all at once (a worker's
 * first report to a restarted primary) have no time in flight behind them yet.
 */
const MIN_OBSERVED_MS = 2_000

/**
 * The fleet's interactive demand: the requests that arrived over the last WINDOW_MS times their
 * mean time in flight (Little's law over about LONG_MS), as a share of the fleet's slots. It is the
 * load the arrivals settle at, and it shows a change within WINDOW_MS, where the requests in flight
 * take their own time to drain: after a peak, about as long as a request takes.
 */
export class Demand {
  private readonly arrivals: number[] = []
  private inFlight = 0
  private atMs = 0
  /** When the first observation came (undefined: none yet). */
  private sinceMs: number | undefined
  /** In flight x time, decayed over LONG_MS. */
  private area = 0
  /** Arrivals, decayed the same way. */
  private count = 0

  /** Interactive requests in flight now: a rise since the last observation counts as arrivals. */
  observe(nowMs: number, inFlight: number): void {
    if (this.sinceMs === undefined) {
      this.sinceMs = nowMs
      this.atMs = nowMs
    }
    const dt = Math.max(0, nowMs - this.atMs)
    if (dt > 0) {
      const decay = Math.exp(-dt / LONG_MS)
      this.area = this.area * decay + this.inFlight * dt
      this.count *= decay
      this.atMs = nowMs
    }
    const rise = inFlight - this.inFlight
    this.inFlight = inFlight
    if (rise <= 0) return
    this.count += rise
    this.expire(nowMs)
    for (let i = 0; i < rise && this.arrivals.length < 100_000; i++) this.arrivals.push(nowMs)
  }

  /** Drops the arrivals older than the longest window. */
  private expire(nowMs: number): void {
    let drop = 0
    while (drop < this.arrivals.length && this.arrivals[drop]! <= nowMs - MAX_WINDOW_MS) drop++
    if (drop > 0) this.arrivals.splice(0, drop)
  }

  /**
   * The demand over `slots`, from the arrivals of the last `windowMs` (at most 1 s): a short
   * window shows a fall sooner, a longer one is steadier (a few arrivals a second, as in a
   * valley, vary a lot over half a second). undefined until the mean time in flight is known.
   */
  load(nowMs: number, slots: number, windowMs = WINDOW_MS): number | undefined {
    this.expire(nowMs)
    if (this.count < MIN_ARRIVALS || this.sinceMs === undefined || nowMs - this.sinceMs < MIN_OBSERVED_MS)
      return undefined
    const window = Math.min(windowMs, MAX_WINDOW_MS)
    let n = 0
    for (let i = this.arrivals.length - 1; i >= 0 && this.arrivals[i]! > nowMs - window; i--) n++
    // Arrivals a millisecond times the mean time in flight (ms): the requests they keep in flight.
    return ((n / window) * (this.area / this.count)) / slots
  }
}

/** The demand over a second (a share of the fleet's slots) that marks a peak of interactive load. */
export const PEAK_DEMAND = 0.45
/** How long after a peak a valley may be entered on the half-second demand. */
export const AFTER_PEAK_MS = 2_000
/** How long the demand over a second must stay low before a valley is entered other than after a peak. */
export const LOW_FOR_MS = 500

/**
 * When the fleet enters a valley of its interactive load, from the demand over the last second
 * and half second (`Demand`), read as batch lines ask to start (scheduler.ts `inValley`):
 *
 * - **After a peak**: within AFTER_PEAK_MS of the demand over a second reading at least
 *   PEAK_DEMAND, once the half-second demand is at most `fill`. The one-second window holds a
 *   peak's arrivals for about a second after they stop; half a second empties twice as soon. And
 *   the mean time in flight still reads the peak's (about 1.3 s in bench/batch-yield.ts, where a
 *   valley's requests take 0.75-1.0 s), so `fill` there is two arrivals in half a second or fewer.
 * - **Otherwise**: once the demand over a second has been at most half of `fill` for LOW_FOR_MS.
 *   A steady load's lulls are short: at ¾ of `fill` and no wait, a 50% load read as a valley in
 *   about one run of 20 s in four.
 *
 * A steady 50% load never reads as a peak (its demand over a second is about 0.24 in
 * bench/batch-yield.ts); an 80% load does (0.46, the 90% peaks 0.54-0.56), and half a second with
 * two or three of its 13 or so arrivals comes about once in a thousand windows.
 * `bun bench/fill-entry-sim.ts` (arrivals alone, 200 runs): after a peak, a valley is found in a
 * median 0.44 s (p90 0.62) against 0.97 (1.69) with the rule before (the demand over a second at
 * ¾ of `fill` at once); a steady 50% load reads as one in none of its runs of 20 s against 0.28,
 * an 80% load in 0.13 against none (docs/batches.md, "Filling").
 */
export class ValleyEntry {
  private peakAtMs = Number.NEGATIVE_INFINITY
  private lowSinceMs: number | undefined

  /** Whether a peak was read within AFTER_PEAK_MS (`second`, the demand over a second, counts now). */
  afterPeak(nowMs: number, second: number | undefined): boolean {
    if (second !== undefined && second >= PEAK_DEMAND) this.peakAtMs = nowMs
    return nowMs - this.peakAtMs <= AFTER_PEAK_MS
  }

  /**
   * Whether a valley may be entered now, given the demand over the last second and half second
   * (`afterPeak`: `afterPeak`'s answer for this reading, when the caller has it already).
   */
  enters(
    nowMs: number,
    second: number,
    half: number,
    fill: number,
    afterPeak = this.afterPeak(nowMs, second),
  ): boolean {
    if (second <= fill / 2) this.lowSinceMs ??= nowMs
    else this.lowSinceMs = undefined
    if (afterPeak && half <= fill) return true
    return this.lowSinceMs !== undefined && nowMs - this.lowSinceMs >= LOW_FOR_MS
  }

  /** Readings stopped (no line asked for a while) or the demand is not known: a low spell starts anew. */
  forget(): void {
    this.lowSinceMs = undefined
  }
}
