import * as hdr from 'hdr-histogram-js'

/** Percentiles of one latency series, in milliseconds (floats, microsecond resolution). */
export interface LatencySummary {
  count: number
  mean: number
  p50: number
  p90: number
  p99: number
  p999: number
  max: number
}

/** Latencies above this are clamped: nothing the benchmark waits for lasts a minute. */
const HIGHEST_US = 60_000_000

/**
 * An HDR histogram of latencies recorded in microseconds. Three significant digits keep every
 * percentile within 0.1% of the true value at any magnitude, in a few tens of KiB, so a run can
 * keep millions of samples without storing them.
 */
export class LatencyHistogram {
  private readonly h: hdr.Histogram = hdr.build({
    bitBucketSize: 64,
    autoResize: false,
    lowestDiscernibleValue: 1,
    highestTrackableValue: HIGHEST_US,
    numberOfSignificantValueDigits: 3,
  })

  /** Records one latency given in milliseconds (performance.now() differences). */
  recordMs(ms: number): void {
    this.recordUs(Math.round(ms * 1000))
  }

  recordUs(us: number): void {
    // 0 is a legal HDR value; negative cannot happen with a monotonic clock but is clamped anyway.
    this.h.recordValue(Math.min(HIGHEST_US, Math.max(0, us)))
  }

  get count(): number {
    return this.h.totalCount
  }

  /** The value at `p` percent (0..100), in milliseconds; 0 when empty. */
  percentileMs(p: number): number {
    return this.h.totalCount === 0 ? 0 : this.h.getValueAtPercentile(p) / 1000
  }

  add(other: LatencyHistogram): void {
    this.h.add(other.h)
  }

  summary(): LatencySummary {
    const n = this.h.totalCount
    return {
      count: n,
      mean: n === 0 ? 0 : this.h.mean / 1000,
      p50: this.percentileMs(50),
      p90: this.percentileMs(90),
      p99: this.percentileMs(99),
      p999: this.percentileMs(99.9),
      max: n === 0 ? 0 : this.h.maxValue / 1000,
    }
  }
}

/** An empty summary, for rows that could not be measured. */
export function emptySummary(): LatencySummary {
  return { count: 0, mean: 0, p50: 0, p90: 0, p99: 0, p999: 0, max: 0 }
}

/**
 * What a hop adds: each percentile of `through` minus the same percentile of `direct`. This is a
 * difference of percentiles, not a percentile of differences (requests are not paired), which is
 * the usual way proxy overhead is quoted; it can come out slightly negative from noise.
 */
export function addedLatency(
  through: LatencySummary,
  direct: LatencySummary,
): { p50: number; p99: number; p999: number } {
  return {
    p50: through.p50 - direct.p50,
    p99: through.p99 - direct.p99,
    p999: through.p999 - direct.p999,
  }
}
