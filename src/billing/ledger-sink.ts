import type { LedgerRows, LedgerRowsWire } from '../storage/ledger-rows.ts'
import type { LedgerSink } from './ledger.ts'

/** Messages to the ledger thread. */
export type ToLedgerThread =
  | { t: 'init'; path: string }
  | { t: 'write'; id: number; rows: LedgerRowsWire }
  | { t: 'close'; id: number }

/** Its answers: done (or the error) per message id. */
export type FromLedgerThread = { t: 'done'; id: number; error?: string }

/**
 * Writes ledger rows to the SQLite file from a thread of its own. A commit on the event loop
 * costs little, but every few thousand pages SQLite checkpoints its write-ahead log in the
 * committing thread, with an fsync: tens of ms, the router's p99. Here those stalls happen off the
 * loop (the event loop's connection leaves checkpoints to the threads: WAL_CHECKPOINT_BYTES). The
 * thread starts with the first flush that has rows, so an idle router never pays for it.
 */
export class ThreadLedgerSink implements LedgerSink {
  private worker: Worker | undefined
  private nextId = 0
  private readonly pending = new Map<number, { resolve: () => void; reject: (e: Error) => void }>()

  constructor(
    private readonly path: string,
    /** The thread's entry point (main.ts knows where it is inside the executable). */
    private readonly entry: string | URL,
  ) {}

  writeRows(rows: LedgerRows): Promise<void> {
    if (rows.length === 0) return Promise.resolve()
    // Columns and a table of strings: a structured clone of typed arrays is a copy of their
    // bytes, where cloning an object per row (or JSON text) cost several times more per row.
    return this.call({ t: 'write', id: 0, rows: rows.toWire() })
  }

  async close(): Promise<void> {
    const w = this.worker
    if (!w) return
    await this.call({ t: 'close', id: 0 }).catch(() => {})
    w.terminate()
    this.worker = undefined
  }

  private call(msg: ToLedgerThread & { id: number }): Promise<void> {
    const w = this.start()
    const id = ++this.nextId
    return new Promise<void>((resolve, reject) => {
      // A write in flight keeps the process alive: at shutdown the last flush must land before
      // the event loop, its server and timers gone, lets the process exit (rows were lost so).
      if (this.pending.size === 0) w.ref()
      this.pending.set(id, { resolve, reject })
      w.postMessage({ ...msg, id })
    })
  }

  private start(): Worker {
    if (this.worker) return this.worker
    const w = new Worker(this.entry)
    w.onmessage = (ev: MessageEvent<FromLedgerThread>) => {
      const p = this.pending.get(ev.data.id)
      if (!p) return
      this.pending.delete(ev.data.id)
      if (this.pending.size === 0) w.unref()
      if (ev.data.error === undefined) p.resolve()
      else p.reject(new Error(ev.data.error))
    }
    // A dead thread fails what it held (the writer keeps those rows and retries) and is replaced.
    w.onerror = (ev) => this.fail(w, new Error(`ledger thread failed: ${ev.message}`))
    w.addEventListener('close', () => this.fail(w, new Error('ledger thread exited')))
    w.postMessage({ t: 'init', path: this.path } satisfies ToLedgerThread)
    // Pending writes keep the process alive (call() refs it), an idle thread does not.
    w.unref()
    this.worker = w
    return w
  }

  private fail(w: Worker, err: Error): void {
    if (this.worker === w) this.worker = undefined
    for (const p of this.pending.values()) p.reject(err)
    this.pending.clear()
  }
}
