/**
 * A Prometheus histogram for one label set: counts per bucket in a typed array, created once and
 * then only incremented. Observing is a scan of at most ~20 bounds and three adds: no string, no
 * object, no label hashing (the caller found this object by a Map lookup or an array index).
 */
export class Histogram {
  /** counts[i]: observations in (bounds[i-1], bounds[i]]; the last slot is above every bound. */
  readonly counts: Float64Array
  sum = 0
  count = 0

  constructor(readonly buckets: Buckets) {
    this.counts = new Float64Array(buckets.bounds.length + 1)
  }

  /** Records one value (seconds, for every histogram here). */
  observe(value: number): void {
    const bounds = this.buckets.bounds
    let i = 0
    while (i < bounds.length && value > bounds[i]!) i++
    this.counts[i]!++
    this.sum += value
    this.count++
  }

  /** The exposition lines of this series; `labels` is `k="v",…` (escaped) or empty. */
  write(out: string[], name: string, labels: string): void {
    const { bounds, le } = this.buckets
    const sep = labels.length > 0 ? `${labels},` : ''
    let cumulative = 0
    for (let i = 0; i < bounds.length; i++) {
      cumulative += this.counts[i]!
      out.push(`${name}_bucket{${sep}le="${le[i]}"} ${cumulative}`)
    }
    out.push(`${name}_bucket{${sep}le="+Inf"} ${this.count}`)
    const braces = labels.length > 0 ? `{${labels}}` : ''
    out.push(`${name}_sum${braces} ${this.sum}`, `${name}_count${braces} ${this.count}`)
  }
}

/** A histogram's upper bounds (seconds), shared by every series of one metric. */
export class Buckets {
  readonly bounds: Float64Array
  /** The bounds as `le` label values, formatted once. */
  readonly le: readonly string[]

  constructor(bounds: readonly number[]) {
    for (let i = 1; i < bounds.length; i++)
      if (!(bounds[i]! > bounds[i - 1]!)) throw new Error('bucket bounds must increase')
    this.bounds = Float64Array.from(bounds)
    this.le = bounds.map(String)
  }
}

/** A label value escaped for the text format (backslash, quote, newline). */
export function escapeLabel(value: string): string {
  return value.replace(/[\\"\n]/g, (c) => (c === '\n' ? '\\n' : `\\${c}`))
}

/** Whole requests, as a client waits for them: 5 ms to 5 min (a long stream). */
export const DURATION_BUCKETS = new Buckets([
  0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300,
])
/** Time to first token: 10 ms (a cached prefix on a near node) to 60 s (a long prompt, queued). */
export const TTFT_BUCKETS = new Buckets([
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1, 1.5, 2.5, 5, 7.5, 10, 15, 20, 30, 45, 60,
])
/** The gap between tokens of a stream: 1 ms to 2.5 s. */
export const ITL_BUCKETS = new Buckets([
  0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5,
])
/** The router's own time per request: 50 µs to 1 s. */
export const OVERHEAD_BUCKETS = new Buckets([
  0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
])
