/**
 * A share of requests as a token bucket: each request earns `share` of a token up to `burst`;
 * each use spends one. Hedges (default 5% of requests) and failover retries (default 20% plus
 * the burst) are capped this way, so a slow or failing fleet is not hammered with copies.
 */
export class ShareBudget {
  private tokens: number
  /** Tokens spent so far. */
  used = 0

  constructor(
    readonly share: number,
    private readonly burst: number,
  ) {
    this.tokens = burst
  }

  /** A request arrived. */
  earn(): void {
    this.tokens = Math.min(this.burst, this.tokens + this.share)
  }

  /** Spends a token; false when the budget is spent. */
  take(): boolean {
    if (this.tokens < 1) return false
    this.tokens -= 1
    this.used++
    return true
  }
}
