/**
 * A quantile over the most recent samples (a ring of `size`), recomputed at most every
 * `every` additions so reading it on each request costs nothing.
 */
export class RatioQuantile {
  private readonly ring: Float64Array
  private next = 0
  count = 0
  private sinceSort = Number.POSITIVE_INFINITY
  private sorted = new Float64Array(0)

  constructor(
    size = 512,
    private readonly every = 32,
  ) {
    this.ring = new Float64Array(size)
  }

  add(sample: number): void {
    if (!Number.isFinite(sample)) return
    this.ring[this.next] = sample
    this.next = (this.next + 1) % this.ring.length
    if (this.count < this.ring.length) this.count++
    this.sinceSort++
  }

  /** The q-quantile (0..1) of the recent samples; NaN when there are none. */
  quantile(q: number): number {
    if (this.count === 0) return Number.NaN
    if (this.sinceSort >= this.every) {
      this.sorted = this.ring.slice(0, this.count).sort()
      this.sinceSort = 0
    }
    const i = Math.min(this.sorted.length - 1, Math.max(0, Math.ceil(q * this.sorted.length) - 1))
    return this.sorted[i]!
  }
}
