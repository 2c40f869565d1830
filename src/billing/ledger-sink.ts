import type { LedgerEntry } from '../storage/store.ts'
import type { LedgerSink } from './ledger.ts'

/** Messages to the ledger thread. */
export type ToLedgerThread =
  | { t: 'init'; path: string }
  | { t: 'write'; id: number; rows: string }
  | { t: 'close'; id: number }

/** Its answers: done (or the error) per message id. */
export type FromLedgerThread = { t: 'done'; id: number; error?: string }

/**
 * Writes ledger rows to the SQLite file from a thread of its own. A commit on the event loop
 * costs little, but every thousand pages SQLite checkpoints its write-ahead log in the committing
 * thread, with an fsync: 15-20 ms, the router's p99. Here those stalls happen off the loop. The
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

  recordLedger(rows: readonly LedgerEntry[]): Promise<void> {
    if (rows.length === 0) return Promise.resolve()
    return this.call({ t: 'write', id: 0, rows: packRows(rows) })
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
      if (ev.data.error === undefined) p.resolve()
      else p.reject(new Error(ev.data.error))
    }
    // A dead thread fails what it held (the writer keeps those rows and retries) and is replaced.
    w.onerror = (ev) => this.fail(w, new Error(`ledger thread failed: ${ev.message}`))
    w.addEventListener('close', () => this.fail(w, new Error('ledger thread exited')))
    w.postMessage({ t: 'init', path: this.path } satisfies ToLedgerThread)
    // Pending writes keep the process alive, an idle thread does not.
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

/**
 * Rows as one JSON text of arrays (the amount as decimal text): posting a string to a thread is
 * a copy, where posting objects is a structured clone, three times the cost per row.
 */
export function packRows(rows: readonly LedgerEntry[]): string {
  return JSON.stringify(
    rows.map((r) => [
      r.requestId,
      r.kind,
      r.orgId,
      r.keyId,
      r.model,
      r.node,
      r.promptTokens,
      r.completionTokens,
      r.costNano.toString(),
      r.batchId,
      r.startedAtMs,
      r.endedAtMs,
      r.outcome,
      r.estimated ? 1 : 0,
    ]),
  )
}

type Packed = [
  string,
  'usage' | 'credit',
  string,
  string | null,
  string | null,
  string | null,
  number,
  number,
  string,
  string | null,
  number,
  number,
  string,
  0 | 1,
]

export function unpackRows(text: string): LedgerEntry[] {
  return (JSON.parse(text) as Packed[]).map((a) => ({
    requestId: a[0],
    kind: a[1],
    orgId: a[2],
    keyId: a[3],
    model: a[4],
    node: a[5],
    promptTokens: a[6],
    completionTokens: a[7],
    costNano: BigInt(a[8]),
    batchId: a[9],
    startedAtMs: a[10],
    endedAtMs: a[11],
    outcome: a[12],
    estimated: a[13] === 1,
  }))
}
