import { InsufficientStorage, isDiskFull, SharedStateUnavailable, type TropaError } from '../errors.ts'
import { type LedgerRowBase, LedgerRows } from '../storage/ledger-rows.ts'
import type { Store } from '../storage/store.ts'

/** Where flushed rows go: the store itself, or a thread writing to it (ledger-sink.ts). */
export interface LedgerSink {
  writeRows(rows: LedgerRows): Promise<void>
  close?(): Promise<void>
}

/** A store written from the event loop (PostgreSQL, over the network; SQLite in memory). */
export function storeSink(store: Pick<Store, 'recordLedgerRows'>): LedgerSink {
  return { writeRows: (rows) => store.recordLedgerRows(rows) }
}

/** Why billing refuses while the ledger's queue is full: the store's disk is full (507), or it is away (503). */
export function ledgerFullError(lastError: unknown): TropaError {
  return isDiskFull(lastError) ? new InsufficientStorage('usage records') : new SharedStateUnavailable()
}

/**
 * Group commit of ledger rows, off the request path: settlements queue here and are written in
 * one transaction every `flushIntervalMs`. A kill loses at most that window of rows (the
 * crash-safety guarantee in docs/billing.md); the in-memory spend already counts them.
 */
export class LedgerWriter {
  private queue = new LedgerRows()
  /** The previous flush's rows, emptied: the next flush queues into them (no new arrays per flush). */
  private spare: LedgerRows | undefined
  private timer: ReturnType<typeof setInterval> | undefined
  private flushing: Promise<void> = Promise.resolve()
  /** Rows of the write under way (neither queued nor written yet). */
  private writing = 0
  private lastErrorMs = 0
  private failure: unknown

  constructor(
    private readonly store: LedgerSink,
    private readonly flushIntervalMs: number,
    private readonly onError: (err: unknown) => void,
    /** Rows this writer may hold unwritten; past it `full()` says so and billing refuses new requests. */
    private readonly maxQueued = Number.POSITIVE_INFINITY,
  ) {}

  /** Rows waiting to be written (the store is slow or unreachable). */
  get backlog(): number {
    return this.queue.length + this.writing
  }

  /** The error of the last flush while flushes fail (the store is away, its disk is full); undefined once one succeeds. */
  get lastError(): unknown {
    return this.failure
  }

  /** The queue is at its bound: new billed requests must be refused until the store catches up. */
  full(): boolean {
    return this.queue.length + this.writing >= this.maxQueued
  }

  start(): void {
    this.timer ??= setInterval(() => void this.flush(), this.flushIntervalMs)
  }

  /** Queues a settled request's usage row: its fields are copied into the queue's columns (LedgerRows.pushRow). */
  pushUsage(
    s: LedgerRowBase,
    orgId: string,
    keyId: string,
    costNano: bigint,
    outcome: string,
    admittedAtMs?: number,
  ): void {
    this.queue.pushRow(s, 'usage', orgId, keyId, costNano, outcome, admittedAtMs)
  }

  /** Writes everything queued so far; concurrent calls are serialised. */
  flush(): Promise<void> {
    this.flushing = this.flushing.then(async () => {
      if (this.queue.length === 0) return
      const batch = this.queue
      this.queue = this.spare ?? new LedgerRows(batch.length)
      this.spare = undefined
      this.writing = batch.length
      try {
        await this.store.writeRows(batch)
        batch.clear()
        this.spare = batch
        this.failure = undefined
      } catch (err) {
        this.failure = err
        // Keep the rows: the next flush retries them, and the store skips any already written.
        batch.append(this.queue)
        this.queue = batch
        // While the store is away every flush fails: say so once every few seconds, not each time.
        const now = Date.now()
        if (now - this.lastErrorMs >= 5000) {
          this.lastErrorMs = now
          this.onError(err)
        }
      } finally {
        this.writing = 0
      }
    })
    return this.flushing
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
    await this.flush()
    await this.store.close?.()
  }
}
