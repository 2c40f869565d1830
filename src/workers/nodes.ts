import { ChangedNodes, type InteractiveReport, type NodePool } from '../routing/nodes.ts'

/**
 * Batches and interactive traffic across `server.workers` processes. The primary runs every batch
 * line, and its workers every interactive request: for a batch to yield to interactive traffic
 * (batches/scheduler.ts) the primary must see the workers' requests on each node, and for routing
 * to keep idle nodes free for a batch (routing/predicted.ts) the workers must see the batch's
 * lines and plan. Each side sends the other what changed, at most once per event-loop turn:
 * - the primary, a `BatchView` to every worker when a line began or ended, was pre-empted, or its
 *   plan changed (and the current one to a worker as it starts);
 * - a worker, while the view says a batch is around (`report`), the interactive requests it runs
 *   on each node that changed, as absolute counts (a report repeated or lost in a restart cannot
 *   leave a count astray); all of them when `report` turns on. Without a batch it sends nothing.
 * The view carries every worker's interactive requests back to each worker, so that its routing
 * tells a node another worker keeps busy from a quiet one (the batch's), as one process does.
 */
export interface BatchView {
  /** `NodePool.batchQuietMs`, or null when unset. */
  readonly quietMs: number | null
  /** A batch wants nodes or lines run: workers report their interactive requests. */
  readonly report: boolean
  /**
   * Nodes with lines, held by the plan, pre-empted lately or (while `report`) serving interactive
   * requests: base URL, lines, held, pre-empted at, the workers' interactive requests there in
   * all, the latest of them started or ended at, and the lines started lately (`batchStarts`)
   * flattened: start, prompt tokens, start, prompt tokens, ...
   */
  readonly nodes: readonly (readonly [string, number, boolean, number, number, number, readonly number[]])[]
}

/** A worker's interactive requests on a node: base URL, in flight, the latest started or ended at (ms). */
export type NodeReport = Readonly<InteractiveReport>

/** The primary's side: sends its view of the batch's nodes, mirrors the workers' interactive requests. */
export class PrimaryNodes {
  /** By worker: interactive requests in flight it reported, by base URL. */
  private readonly reported = new Map<number, Map<string, number>>()
  private scheduled = false
  private lastSent = ''
  private view: BatchView = { quietMs: null, report: false, nodes: [] }

  constructor(
    private readonly pool: NodePool,
    /** Whether a batch wants nodes (the scheduler's `wanting`). */
    private readonly wanting: () => boolean,
    private readonly sendAll: (view: BatchView) => void,
  ) {
    pool.onBatchState = () => this.changed()
  }

  /** What the batch holds of the nodes may have changed: the workers hear of it this turn. */
  changed(): void {
    if (this.scheduled) return
    this.scheduled = true
    setImmediate(this.flush)
  }

  private readonly flush = () => {
    this.scheduled = false
    const view = this.current()
    const text = JSON.stringify(view)
    if (text === this.lastSent) return
    this.lastSent = text
    this.view = view
    this.sendAll(view)
  }

  private current(): BatchView {
    const nodes: [string, number, boolean, number, number, number, number[]][] = []
    let lines = 0
    for (const n of this.pool.nodes.values()) lines += n.batchInFlight
    const report = this.wanting() || lines > 0
    for (const n of this.pool.nodes.values()) {
      // The primary serves no request: every interactive request it knows of is a worker's.
      const busy = report && (n.remoteInteractive > 0 || n.lastInteractiveAtMs > 0)
      if (n.batchInFlight > 0 || n.batchHeld || Number.isFinite(n.batchPreemptedAtMs) || busy)
        nodes.push([
          n.baseUrl,
          n.batchInFlight,
          n.batchHeld,
          n.batchPreemptedAtMs,
          report ? n.remoteInteractive : 0,
          report ? n.lastInteractiveAtMs : 0,
          n.batchStarts.flatMap((x) => [x.atMs, x.tokens]),
        ])
    }
    return { quietMs: this.pool.batchQuietMs ?? null, report, nodes }
  }

  /** The view a worker that starts now begins with. */
  latest(): BatchView {
    return this.view
  }

  /** A worker's interactive requests on the nodes it names. */
  report(worker: number, nodes: readonly NodeReport[]): void {
    let mine = this.reported.get(worker)
    if (!mine) {
      mine = new Map()
      this.reported.set(worker, mine)
    }
    const now = Date.now()
    for (const [baseUrl, n, atMs] of nodes) {
      const node = this.pool.nodes.get(baseUrl)
      const before = mine.get(baseUrl) ?? 0
      mine.set(baseUrl, n)
      if (node) this.pool.mirrorInteractive(node, n - before, atMs, now)
    }
    // The workers' views carry every worker's requests.
    this.changed()
  }

  /** A worker exited: its requests are gone with it. */
  forget(worker: number): void {
    const mine = this.reported.get(worker)
    this.reported.delete(worker)
    if (!mine) return
    const now = Date.now()
    for (const [baseUrl, n] of mine) {
      const node = this.pool.nodes.get(baseUrl)
      if (node && n !== 0) this.pool.mirrorInteractive(node, -n, now, now)
    }
    this.changed()
  }
}

/** A worker's side: takes the primary's view into its routing, reports its interactive requests. */
export class WorkerNodes {
  private reporting = false
  private readonly changed: ChangedNodes
  /** What this worker last reported of each node (the view's totals less these are the other workers'). */
  private readonly reported = new Map<string, number>()

  constructor(
    private readonly pool: NodePool,
    private readonly send: (nodes: NodeReport[]) => void,
  ) {
    this.changed = new ChangedNodes((reports) => {
      if (!this.reporting) return
      for (const [baseUrl, n] of reports) this.reported.set(baseUrl, n)
      this.send(reports)
    })
    pool.onInteractiveChange = (_nowMs, node) => {
      if (this.reporting) this.changed.add(node)
    }
  }

  /** The primary's view: its lines count on the nodes here as they do in one process. */
  apply(view: BatchView): void {
    this.pool.batchQuietMs = view.quietMs ?? undefined
    const byUrl = new Map(view.nodes.map((x) => [x[0], x] as const))
    for (const n of this.pool.nodes.values()) {
      const [, lines, held, preemptedAtMs, all, lastAtMs, starts] = byUrl.get(n.baseUrl) ?? [
        '',
        0,
        false,
        Number.NEGATIVE_INFINITY,
        0,
        0,
        [],
      ]
      // Lines count in inFlight as in one process, so interactiveInFlight stays this worker's own.
      n.inFlight += lines - n.batchInFlight
      n.batchInFlight = lines
      n.batchHeld = held
      n.batchPreemptedAtMs = preemptedAtMs ?? Number.NEGATIVE_INFINITY
      // What routing counts of the lines' prefill (routing/predicted.ts); a view from before it had none.
      n.batchStarts = []
      for (let i = 0; i + 1 < (starts?.length ?? 0); i += 2)
        n.batchStarts.push({ atMs: starts![i]!, tokens: starts![i + 1]! })
      // The other workers' requests there (the totals lag this worker's last report by a turn).
      n.remoteInteractive = view.report ? Math.max(0, all - (this.reported.get(n.baseUrl) ?? 0)) : 0
      if (view.report && lastAtMs > n.lastInteractiveAtMs) n.lastInteractiveAtMs = lastAtMs
    }
    const was = this.reporting
    this.reporting = view.report
    if (view.report && !was) {
      // Every node, so that the primary's counts start right (they may be from before a pause).
      for (const n of this.pool.nodes.values()) this.changed.add(n)
      this.changed.flush()
    }
  }
}
