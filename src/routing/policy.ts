import type { Candidate, NodeState } from './nodes.ts'

/** What a policy may look at besides the nodes. */
export interface RouteRequest {
  readonly modelId: string
  /** Prompt tokens as counted by the router. */
  readonly promptTokens: number
  /**
   * Chained hashes of the prompt's fixed-size blocks (routing/prefix.ts), first block first:
   * two prompts share a prefix of k blocks exactly when their first k hashes are equal.
   * Empty when the router does not index this request.
   */
  readonly prefix: readonly number[]
  /** Prompt tokens per prefix block (to turn matched blocks into tokens). */
  readonly blockTokens: number
  /** A session hint (the `user` field or the x-session-id header): ties go to the same node. */
  readonly session: string | undefined
  /** Whether the response streams (only then is the first chunk observed). */
  readonly stream: boolean
  /** Nodes already tried for this request (failover, hedging). */
  readonly exclude: ReadonlySet<Candidate>
  /**
   * While a batch could have a node (one runs and the fleet's interactive load leaves it one):
   * how long a node must go without interactive traffic to be the batch's (routing/nodes.ts).
   */
  readonly batchQuietMs?: number | undefined
  /**
   * Whether a warm-up of a node never measured could be sent with this request (the router's
   * first attempt at a chat or completions request, under its cap of warm-ups in flight).
   */
  readonly canExplore?: boolean | undefined
  /** The request's TTFT budget, ms (deadline-aware admission), if it carries one. */
  readonly ttftBudgetMs?: number | undefined
  readonly nowMs: number
}

/** How an attempt on a node ended, as far as routing cares. */
export type Outcome =
  /** The node served it (a client's cancel after the first byte counts here too). */
  | 'ok'
  /** Refused for load: 429, 503. Collapse the node's estimated rate; try another node. */
  | 'overloaded'
  /** Broken, timed out, 5xx: a health failure. */
  | 'failed'
  /** Abandoned by the router or the client before the node answered (lost hedge, disconnect). */
  | 'cancelled'

/** A warm-up the policy asks for (`RoutingPolicy.takeWarmup`), and why. */
export interface Warmup {
  readonly candidate: Candidate
  /** `session`: a spread new session's new node; `explore`: a node never measured. */
  readonly reason: WarmupReason
}
export type WarmupReason = 'session' | 'explore'

/**
 * One dispatch of one request to one node. The pipeline makes it, hands it to the policy's
 * hooks, and passes it back with each observation, so a policy can keep what it predicted
 * (say, the uncached tokens it added to a node's queue) and take exactly that back.
 */
export class Attempt {
  /** A warm-up (`RoutingPolicy.takeWarmup`): one token out, answered to no one. */
  warmup = false
  /** When the first chunk arrived (streaming), if it has. */
  firstAtMs: number | undefined
  /** The policy's predicted time to first token for this attempt, ms, if it predicts. */
  predictedTtftMs: number | undefined
  /** The policy's prediction for the next best node when this one was chosen, ms, if it predicts. */
  alternativeTtftMs: number | undefined
  /** Uncached prompt tokens the policy counted as queued on the node for this attempt. */
  queuedTokens = 0
  /** Prefix tokens the policy predicted cached on the node. */
  predictedCachedTokens = 0
  /** Whether this attempt is counted as decoding on the node. */
  decoding = false
  /** Its own uncached prompt tokens as predicted at the start (queuedTokens drops to 0 at the first chunk). */
  ownTokens = 0
  /** Uncached tokens queued on the node ahead of this attempt when it started, its own included. */
  queueAheadTokens = 0
  /** Requests decoding on the node when it started. */
  decodingAtStart = 0
  /**
   * What the node's speed alone predicted past the round trip, ms: the prediction without its
   * slowness factor and a stall's silence pricing (`PredictedTtft.observeShort` compares with it).
   */
  predictedSpeedMs: number | undefined
  /**
   * The time its queue ahead took to prefill, ms (the first token's wait less the network and
   * the decode steps), kept from the first chunk until the end reports the cached tokens.
   */
  prefillMs: number | undefined
  /** Its slot among its node's attempts without a first chunk (the policy's), -1 when in none. */
  pendingSlot = -1

  constructor(
    readonly candidate: Candidate,
    /** Its request; past the first chunk without the prefix blocks and the nodes tried (shed). */
    public req: RouteRequest,
    readonly startedAtMs: number,
  ) {}

  /**
   * Lets go of what only routing reads: the prompt's prefix blocks (a number per 256 characters of
   * prompt) and the nodes tried. A stream's attempt lives as long as the stream, and nothing reads
   * either once it has its first chunk (a policy matches prefixes of attempts still without one).
   */
  shed(): void {
    if (this.req.prefix.length > 0 || this.req.exclude.size > 0)
      this.req = { ...this.req, prefix: NO_BLOCKS, exclude: NO_NODES }
  }
}

const NO_BLOCKS: readonly number[] = Object.freeze([])
const NO_NODES: ReadonlySet<Candidate> = new Set()

/** A node's own load report (vLLM or llama.cpp /metrics), when polled. */
export interface NodeMetrics {
  /** Requests waiting for a slot. */
  readonly waiting: number
  /** Requests running (prefilling or decoding). */
  readonly running: number
  /** KV cache use, 0..1, if reported. */
  readonly kvUsage: number | undefined
  /** The KV cache's size in blocks (vLLM's `cache_config_info` `num_gpu_blocks`), if reported. */
  readonly cacheBlocks?: number
}

/**
 * Picks the node for a request among a model's candidates, and learns from what happens to the
 * requests it placed. Time comes in as arguments (never the wall clock) and randomness from an
 * injected generator, so the same policy runs on live traffic and in the virtual-time benchmark.
 */
export interface RoutingPolicy {
  readonly name: string
  /** The node to try next, or undefined when none can take it. */
  choose(candidates: readonly Candidate[], req: RouteRequest): Candidate | undefined
  /** The request was sent to `a.candidate` (the pool's in-flight count is already raised). */
  started(a: Attempt): void
  /** The first chunk of a streamed response arrived. */
  firstChunk(a: Attempt, nowMs: number): void
  /**
   * The attempt ended; `cachedTokens` when the upstream reported prompt_tokens_details, and
   * `completionTokens` when known (to learn the node's inter-token latency).
   */
  ended(
    a: Attempt,
    nowMs: number,
    outcome: Outcome,
    cachedTokens: number | undefined,
    completionTokens?: number,
  ): void
  /** The predicted time to first token of `req` on `c`, ms, without placing it (a quote). */
  estimateTtftMs?(c: Candidate, req: RouteRequest): number | undefined
  /** A /metrics poll of a node (only when polling is on). */
  nodeMetrics?(node: NodeState, m: NodeMetrics, nowMs: number): void
  /**
   * When to send a copy of a streamed request that has no first chunk yet to the next best
   * node (hedging), as an absolute time in ms; undefined: do not hedge this attempt.
   */
  hedgeAtMs?(a: Attempt): number | undefined
  /**
   * After `started`: a node to warm with the request's prompt (one token out, answered to no one):
   * where the request's session will live, or a node never measured, to measure. The caller sends
   * it as an Attempt with `warmup` set, or calls `declineWarmup` with the request's attempt (a
   * session then stays where it is served).
   */
  takeWarmup?(): Warmup | undefined
  /** `warmed`: the node the warm-up went to, when it failed (undone only if the session is still bound there). */
  declineWarmup?(a: Attempt, warmed?: NodeState): void
  /** The node left the config (a reload) and has nothing in flight: drop what was learned of it. */
  forget?(node: NodeState): void
}

/**
 * Whether a node can take one more interactive request now. Batch lines do not count: an
 * interactive request pre-empts them (batches/scheduler.ts), so a batch never causes a 503.
 */
export function admissible(c: Candidate, req: RouteRequest): boolean {
  return (
    !req.exclude.has(c) && c.node.available(req.nowMs) && c.node.interactiveInFlight < c.route.maxConcurrency
  )
}

/** Every node is ejected: the one whose ejection ends first, rather than failing outright. */
export function soonestBack(candidates: readonly Candidate[], req: RouteRequest): Candidate | undefined {
  let best: Candidate | undefined
  for (const c of candidates) {
    if (req.exclude.has(c) || c.node.interactiveInFlight >= c.route.maxConcurrency) continue
    if (!best || c.node.ejectedUntilMs < best.node.ejectedUntilMs) best = c
  }
  return best
}

/**
 * The healthy node with the fewest requests in flight per unit of weight, under its
 * concurrency cap. Ties go to a rotating start so equal nodes share the load.
 */
export class LeastInFlight implements RoutingPolicy {
  readonly name = 'least-in-flight'
  private turn = 0

  choose(candidates: readonly Candidate[], req: RouteRequest): Candidate | undefined {
    let best: Candidate | undefined
    let bestScore = Number.POSITIVE_INFINITY
    const n = candidates.length
    this.turn = (this.turn + 1) % Math.max(1, n)
    for (let i = 0; i < n; i++) {
      const c = candidates[(this.turn + i) % n]!
      if (!admissible(c, req)) continue
      const score = c.node.interactiveInFlight / c.route.weight
      if (score < bestScore) {
        best = c
        bestScore = score
      }
    }
    return best ?? soonestBack(candidates, req)
  }

  started(): void {}
  firstChunk(): void {}
  ended(): void {}
}
