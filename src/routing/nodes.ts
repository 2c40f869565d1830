import type { ModelConfig, RouteConfig } from '../config/load.ts'

/**
 * What the router knows about one upstream node (one base URL), shared by every model routed
 * to it. Passive health: consecutive failures eject the node for a while.
 */
export class NodeState {
  inFlight = 0
  /** Batch lines among inFlight. */
  batchInFlight = 0
  /** When an interactive request last started here (batch lines yield while this is recent). */
  lastInteractiveAtMs = 0
  consecutiveFailures = 0
  /** The node answered its last request; until then (and after a failure) it is probed first. */
  answering = false
  ejectedUntilMs = 0
  requests = 0
  failures = 0

  constructor(
    readonly name: string,
    readonly baseUrl: string,
  ) {}

  available(nowMs: number): boolean {
    return nowMs >= this.ejectedUntilMs
  }
}

/** A model's route bound to its node's shared state. */
export interface Candidate {
  readonly route: RouteConfig
  readonly node: NodeState
}

const EJECT_AFTER_FAILURES = 3
const EJECT_BASE_MS = 2_000
const EJECT_MAX_MS = 30_000

/** All upstream nodes, and the candidates of each model. */
export class NodePool {
  readonly nodes = new Map<string, NodeState>()
  private readonly byModel = new Map<string, Candidate[]>()

  constructor(models: readonly ModelConfig[]) {
    for (const m of models) {
      const list = m.routes.map((route) => {
        let node = this.nodes.get(route.baseUrl)
        if (!node) {
          node = new NodeState(route.node, route.baseUrl)
          this.nodes.set(route.baseUrl, node)
        }
        return { route, node }
      })
      this.byModel.set(m.id, list)
    }
  }

  candidates(modelId: string): readonly Candidate[] {
    return this.byModel.get(modelId) ?? []
  }

  begin(node: NodeState, nowMs = Date.now()): void {
    node.inFlight++
    node.requests++
    node.lastInteractiveAtMs = nowMs
  }

  /** A batch line starts on the node (counted apart, so batches can yield to interactive traffic). */
  beginBatch(node: NodeState): void {
    node.inFlight++
    node.batchInFlight++
    node.requests++
  }

  endBatch(node: NodeState, ok: boolean): void {
    node.batchInFlight--
    this.end(node, ok)
  }

  /** The request left the node; `ok` says whether the node served it (a client's cancel counts as ok). */
  end(node: NodeState, ok: boolean, nowMs = Date.now()): void {
    node.inFlight--
    if (ok) {
      node.consecutiveFailures = 0
      node.answering = true
      return
    }
    node.answering = false
    node.failures++
    node.consecutiveFailures++
    if (node.consecutiveFailures >= EJECT_AFTER_FAILURES) {
      // Back off longer each time the node keeps failing after its return.
      const times = node.consecutiveFailures - EJECT_AFTER_FAILURES
      node.ejectedUntilMs = nowMs + Math.min(EJECT_MAX_MS, EJECT_BASE_MS * 2 ** times)
    }
  }
}
