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
