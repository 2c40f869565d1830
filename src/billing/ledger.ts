import type { LedgerEntry, Store } from '../storage/store.ts'

/**
 * Group commit of ledger rows, off the request path: settlements queue here and are written in
 * one transaction every `flushIntervalMs`. A kill loses at most that window of rows (the
 * crash-safety guarantee in docs/billing.md); the in-memory spend already counts them.
 */
export class LedgerWriter {
  private queue: LedgerEntry[] = []
  private timer: ReturnType<typeof setInterval> | undefined
  private flushing: Promise<void> = Promise.resolve()

  constructor(
    private readonly store: Store,
    private readonly flushIntervalMs: number,
    private readonly onError: (err: unknown) => void,
  ) {}

  start(): void {
    this.timer ??= setInterval(() => void this.flush(), this.flushIntervalMs)
  }

  push(entry: LedgerEntry): void {
    this.queue.push(entry)
  }

  /** Writes everything queued so far; concurrent calls are serialised. */
  flush(): Promise<void> {
    this.flushing = this.flushing.then(async () => {
      if (this.queue.length === 0) return
      const batch = this.queue
      this.queue = []
      try {
        await this.store.recordLedger(batch)
      } catch (err) {
        // Keep the rows: the next flush retries them, and recordLedger skips any already written.
        this.queue = batch.concat(this.queue)
        this.onError(err)
      }
    })
    return this.flushing
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
    await this.flush()
  }
}
