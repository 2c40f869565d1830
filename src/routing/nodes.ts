import type { ModelConfig, RouteConfig } from '../config/load.ts'

/**
 * What the router knows about one upstream node (one base URL), shared by every model routed
 * to it. Passive health: consecutive failures eject the node for a while.
 */
export class NodeState {
  inFlight = 0
  /** Batch lines among inFlight. */
  batchInFlight = 0
  /**
   * When an interactive request last started or ended here: batch lines are admitted only to a
   * node with none in flight and none for a moment (batches/scheduler.ts).
   */
  lastInteractiveAtMs = 0
  /** When an interactive request last started here: a batch line starts a moment after it, not with it (batches/scheduler.ts `pace`). */
  lastInteractiveStartMs = Number.NEGATIVE_INFINITY
  /**
   * Given whole to a running batch by the scheduler's packing plan (batches/scheduler.ts `plan`):
   * interactive requests go here only when the nodes kept for them would be much slower
   * (routing/predicted.ts `batchHeldFactor`), and batch lines fill it once its last interactive
   * request ended.
   */
  batchHeld = false
  /**
   * When batch lines here were last pre-empted: a request sent about then waits for the lines'
   * engine iteration under way, which says nothing of the node's speed (routing/predicted.ts).
   */
  batchPreemptedAtMs = Number.NEGATIVE_INFINITY
  /**
   * The batch lines started here lately (at most the last BATCH_STARTS), with their prompt
   * tokens: routing counts what their prefill has left as work queued ahead of a new request
   * (routing/predicted.ts `predict`), so a request goes to a node whose line is not prefilling.
   */
  batchStarts: { atMs: number; tokens: number }[] = []
  consecutiveFailures = 0
  /** The node answered its last request; until then (and after a failure) it is probed first. */
  answering = false
  ejectedUntilMs = 0
  /** Ejections so far (for /metrics). */
  ejections = 0
  requests = 0
  failures = 0
  /** Outcomes in the current error-rate window. */
  windowStartMs = 0
  windowRequests = 0
  windowFailures = 0

  constructor(
    readonly name: string,
    readonly baseUrl: string,
  ) {}

  /**
   * Interactive requests other processes run on the node, as they last reported them (the
   * workers of the primary that runs the batches, the other nodes of a cluster: src/workers/nodes.ts,
   * src/cluster/peer-nodes.ts). Not in inFlight: this process's routing and limits count its own.
   */
  remoteInteractive = 0

  /** Interactive requests in flight (batch lines are not: an interactive request pre-empts them). */
  get interactiveInFlight(): number {
    return this.inFlight - this.batchInFlight
  }

  /** Interactive requests on the node from this process and the others that report theirs (batches yield to them all). */
  get interactiveEverywhere(): number {
    return this.inFlight - this.batchInFlight + this.remoteInteractive
  }

  /** No interactive request in flight here, and none for `quietMs`: batch lines may use the node. */
  quiet(nowMs: number, quietMs: number): boolean {
    return this.interactiveEverywhere === 0 && nowMs - this.lastInteractiveAtMs >= quietMs
  }

  /**
   * Whether the node may take a request now: not ejected (the breaker open), and while it comes
   * back (half-open, then ramping over RAMP_MS) only a few requests at a time.
   */
  available(nowMs: number): boolean {
    if (nowMs < this.ejectedUntilMs) return false
    if (this.ejections === 0) return true
    const since = nowMs - this.ejectedUntilMs
    if (since >= RAMP_MS) return true
    return this.inFlight < 1 + Math.floor((since / RAMP_MS) * RAMP_MAX_IN_FLIGHT)
  }

  /** Opens the breaker: no traffic until `untilMs`, then a gradual return. */
  eject(nowMs: number, forMs: number): void {
    this.ejectedUntilMs = Math.max(this.ejectedUntilMs, nowMs + forMs)
    this.ejections++
    this.answering = false
  }
}

/** Batch line starts a node remembers for routing (`NodeState.batchStarts`). */
const BATCH_STARTS = 4

/** After an ejection, a node's in-flight cap ramps from 1 to this over RAMP_MS. */
const RAMP_MS = 10_000
const RAMP_MAX_IN_FLIGHT = 32

/** A model's route bound to its node's shared state. */
export interface Candidate {
  readonly route: RouteConfig
  readonly node: NodeState
}

const EJECT_AFTER_FAILURES = 3
const EJECT_BASE_MS = 2_000
const EJECT_MAX_MS = 30_000
/** Outlier detection by error rate: over a window, at least this many requests, this share failed. */
const RATE_WINDOW_MS = 10_000
const RATE_MIN_REQUESTS = 10
const RATE_MAX_FAILURE_SHARE = 0.5

/** All upstream nodes, and the candidates of each model. */
export class NodePool {
  readonly nodes = new Map<string, NodeState>()
  private readonly byModel = new Map<string, Candidate[]>()

  constructor(models: readonly ModelConfig[]) {
    this.replace(models)
  }

  /**
   * The models' routes of a reloaded config. A node that stays (same base URL and name) keeps
   * its state: in flight, health, what the policy learned of it. A removed node drains: its
   * requests in flight hold their candidates and finish there; no new one is sent to it.
   * Returns the nodes added and removed, by name.
   */
  replace(models: readonly ModelConfig[]): { added: string[]; removed: NodeState[] } {
    const before = new Map(this.nodes)
    this.nodes.clear()
    this.byModel.clear()
    const added: string[] = []
    for (const m of models) {
      const list = m.routes.map((route) => {
        let node = this.nodes.get(route.baseUrl)
        if (!node) {
          const kept = before.get(route.baseUrl)
          node = kept?.name === route.node ? kept : new NodeState(route.node, route.baseUrl)
          if (node !== kept) added.push(node.name)
          this.nodes.set(route.baseUrl, node)
        }
        return { route, node }
      })
      this.byModel.set(m.id, list)
    }
    const removed = [...before.values()].filter((n) => this.nodes.get(n.baseUrl) !== n)
    return { added, removed }
  }

  /**
   * Told when an interactive request starts on a node that runs batch lines: the batch
   * scheduler pre-empts them there (interactive traffic always wins the node).
   */
  onInteractive: ((node: NodeState) => void) | undefined
  /**
   * Set while a batch is running (its lines want nodes) and the fleet's interactive load is low
   * enough for it to have a node (batches/scheduler.ts `plan`): how long a node must go without
   * interactive traffic before batch lines may use it. Interactive requests then prefer nodes
   * already serving interactive traffic (routing/predicted.ts), so that idle nodes stay free;
   * unset, a batch changes nothing in routing.
   */
  batchQuietMs: number | undefined
  /**
   * Told after an interactive request started or ended on a node (the batch scheduler's packing
   * plan; in a worker process, its report to the primary: src/workers/nodes.ts).
   */
  onInteractiveChange: ((nowMs: number, node: NodeState) => void) | undefined
  /**
   * Told when what batches hold of the nodes may have changed (lines began or ended, the
   * scheduler's plan ran): the primary passes it on to its workers (src/workers/nodes.ts).
   */
  onBatchState: (() => void) | undefined

  candidates(modelId: string): readonly Candidate[] {
    return this.byModel.get(modelId) ?? []
  }

  /** An interactive request starts on the node. */
  begin(node: NodeState, nowMs = Date.now()): void {
    node.inFlight++
    node.requests++
    node.lastInteractiveAtMs = nowMs
    node.lastInteractiveStartMs = nowMs
    if (node.batchInFlight > 0) this.onInteractive?.(node)
    this.onInteractiveChange?.(nowMs, node)
  }

  /**
   * Interactive requests that other processes run on the node (the workers of the primary that
   * runs the batches: src/workers/nodes.ts), `delta` more or fewer than reported before, the
   * latest started or ended at `atMs`. The scheduler sees them as its own: lines on the node are
   * pre-empted as they arrive, and the plan follows them.
   */
  mirrorInteractive(node: NodeState, delta: number, atMs: number, nowMs = Date.now()): void {
    node.remoteInteractive += delta
    node.lastInteractiveAtMs = Math.max(node.lastInteractiveAtMs, atMs)
    if (delta > 0) node.lastInteractiveStartMs = Math.max(node.lastInteractiveStartMs, atMs)
    if (delta > 0 && node.batchInFlight > 0) this.onInteractive?.(node)
    this.onInteractiveChange?.(nowMs, node)
  }

  /** A batch line starts on the node (counted apart, so batches can yield to interactive traffic). */
  beginBatch(node: NodeState, promptTokens = 0, nowMs = Date.now()): void {
    node.inFlight++
    node.batchInFlight++
    node.requests++
    if (promptTokens > 0) {
      node.batchStarts.push({ atMs: nowMs, tokens: promptTokens })
      if (node.batchStarts.length > BATCH_STARTS) node.batchStarts.shift()
    }
    this.onBatchState?.()
  }

  endBatch(node: NodeState, ok: boolean, nowMs = Date.now()): void {
    node.batchInFlight--
    node.inFlight--
    this.outcome(node, ok, nowMs)
    this.onBatchState?.()
  }

  /**
   * A batch line admitted to the node at `atMs` was never sent (its money could not be reserved):
   * it ends as `endBatch` has it, and its start goes (routing must not wait for its prefill).
   */
  unsentBatch(node: NodeState, atMs: number, promptTokens: number): void {
    const starts = node.batchStarts
    for (let i = starts.length - 1; i >= 0; i--)
      if (starts[i]!.atMs === atMs && starts[i]!.tokens === promptTokens) {
        starts.splice(i, 1)
        break
      }
    this.endBatch(node, true)
  }

  /** A batch line was pre-empted on the node: it leaves with no verdict on the node. */
  preemptBatch(node: NodeState, nowMs = Date.now()): void {
    node.batchInFlight--
    node.inFlight--
    node.batchPreemptedAtMs = nowMs
    // The newest line goes first, and its prefill with it.
    node.batchStarts.pop()
    this.onBatchState?.()
  }

  /** An interactive request left the node before it answered, through no fault of the node (lost hedge, client gone). */
  cancel(node: NodeState, nowMs = Date.now()): void {
    node.inFlight--
    node.lastInteractiveAtMs = nowMs
    this.onInteractiveChange?.(nowMs, node)
  }

  /** An interactive request left the node; `ok` says whether the node served it. */
  end(node: NodeState, ok: boolean, nowMs = Date.now()): void {
    node.inFlight--
    node.lastInteractiveAtMs = nowMs
    this.onInteractiveChange?.(nowMs, node)
    this.outcome(node, ok, nowMs)
  }

  /**
   * Passive outlier detection: consecutive failures, or a high failure share over a window,
   * eject the node, each time longer while it keeps failing after its return.
   */
  outcome(node: NodeState, ok: boolean, nowMs: number): void {
    if (nowMs - node.windowStartMs > RATE_WINDOW_MS) {
      node.windowStartMs = nowMs
      node.windowRequests = 0
      node.windowFailures = 0
    }
    node.windowRequests++
    if (ok) {
      node.consecutiveFailures = 0
      node.answering = true
      return
    }
    node.windowFailures++
    node.answering = false
    node.failures++
    node.consecutiveFailures++
    const rateBad =
      node.windowRequests >= RATE_MIN_REQUESTS &&
      node.windowFailures / node.windowRequests >= RATE_MAX_FAILURE_SHARE
    if (node.consecutiveFailures >= EJECT_AFTER_FAILURES || rateBad) {
      const times = Math.max(0, node.consecutiveFailures - EJECT_AFTER_FAILURES)
      if (nowMs >= node.ejectedUntilMs) node.eject(nowMs, Math.min(EJECT_MAX_MS, EJECT_BASE_MS * 2 ** times))
      if (rateBad) {
        node.windowRequests = 0
        node.windowFailures = 0
      }
    }
  }
}

/** A node's interactive requests as another process is told of them: base URL, in flight, latest started or ended at (ms). */
export type InteractiveReport = [string, number, number]

export const interactiveReport = (n: NodeState): InteractiveReport => [
  n.baseUrl,
  n.interactiveInFlight,
  n.lastInteractiveAtMs,
]

/**
 * Nodes whose interactive requests changed, handed over once at the end of the event-loop turn
 * (src/workers/nodes.ts, src/cluster/peer-nodes.ts tell other processes of them).
 */
export class ChangedNodes {
  private readonly dirty = new Set<NodeState>()
  private scheduled = false

  constructor(private readonly send: (reports: InteractiveReport[]) => void) {}

  add(node: NodeState): void {
    this.dirty.add(node)
    if (this.scheduled) return
    this.scheduled = true
    setImmediate(this.flush)
  }

  readonly flush = (): void => {
    this.scheduled = false
    if (this.dirty.size === 0) return
    const reports: InteractiveReport[] = []
    for (const n of this.dirty) reports.push(interactiveReport(n))
    this.dirty.clear()
    this.send(reports)
  }
}
