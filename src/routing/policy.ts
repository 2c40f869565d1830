import type { Candidate } from './nodes.ts'

/** What a policy may look at besides the nodes. */
export interface RouteRequest {
  readonly modelId: string
  readonly promptTokens: number
  /** Nodes already tried for this request (failover). */
  readonly exclude: ReadonlySet<Candidate>
  readonly nowMs: number
}

/** Picks the node for a request among a model's candidates; undefined when none can take it. */
export interface RoutingPolicy {
  choose(candidates: readonly Candidate[], req: RouteRequest): Candidate | undefined
}

/**
 * The healthy node with the fewest requests in flight per unit of weight, under its
 * concurrency cap. Ties go to a rotating start so equal nodes share the load.
 */
export class LeastInFlight implements RoutingPolicy {
  private turn = 0

  choose(candidates: readonly Candidate[], req: RouteRequest): Candidate | undefined {
    let best: Candidate | undefined
    let bestScore = Number.POSITIVE_INFINITY
    const n = candidates.length
    this.turn = (this.turn + 1) % Math.max(1, n)
    for (let i = 0; i < n; i++) {
      const c = candidates[(this.turn + i) % n]!
      if (req.exclude.has(c) || !c.node.available(req.nowMs) || c.node.inFlight >= c.route.maxConcurrency)
        continue
      const score = c.node.inFlight / c.route.weight
      if (score < bestScore) {
        best = c
        bestScore = score
      }
    }
    if (best) return best
    // Every node is ejected: try the one whose ejection ends first rather than failing outright.
    for (const c of candidates) {
      if (req.exclude.has(c) || c.node.inFlight >= c.route.maxConcurrency) continue
      if (!best || c.node.ejectedUntilMs < best.node.ejectedUntilMs) best = c
    }
    return best
  }
}
