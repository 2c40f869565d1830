/**
 * The peers' routing policies, rebuilt against Tropa's RoutingPolicy interface for the
 * virtual-time benchmark. Each follows its source as closely as the interface allows; where a
 * peer sees something Tropa's router does not (SGLang's router tokenizes text itself), the
 * nearest equivalent is used and said so.
 */
import type { Candidate, NodeState } from '../../src/routing/nodes.ts'
import {
  type Attempt,
  admissible,
  type Outcome,
  type RouteRequest,
  type RoutingPolicy,
  soonestBack,
} from '../../src/routing/policy.ts'
import { PrefixIndex } from '../../src/routing/prefix.ts'

const usable = (cands: readonly Candidate[], req: RouteRequest) => cands.filter((c) => admissible(c, req))

/** Rotates through the nodes (Portkey's loadbalance with equal weights, nginx's default). */
export class RoundRobin implements RoutingPolicy {
  readonly name = 'round-robin'
  private turn = 0
  choose(cands: readonly Candidate[], req: RouteRequest) {
    const n = cands.length
    for (let i = 0; i < n; i++) {
      const c = cands[(this.turn + i) % n]!
      if (admissible(c, req)) {
        this.turn = (this.turn + i + 1) % n
        return c
      }
    }
    return soonestBack(cands, req)
  }
  started() {}
  firstChunk() {}
  ended() {}
}

/** Two nodes at random, the one with fewer requests in flight (Envoy's LEAST_REQUEST, P2C). */
export class P2CLeastRequest implements RoutingPolicy {
  readonly name = 'p2c-least-request'
  constructor(private readonly rng: () => number) {}
  choose(cands: readonly Candidate[], req: RouteRequest) {
    const ok = usable(cands, req)
    if (ok.length === 0) return soonestBack(cands, req)
    const a = ok[Math.floor(this.rng() * ok.length)]!
    const b = ok[Math.floor(this.rng() * ok.length)]!
    return a.node.inFlight <= b.node.inFlight ? a : b
  }
  started() {}
  firstChunk() {}
  ended() {}
}

/**
 * Finagle's / Linkerd's peak EWMA with P2C: cost = latency EWMA x (in flight + 1); a sample above
 * the average replaces it at once (peak), lower ones decay in with time constant 10 s. The
 * latency is the time to the response's first byte, which for a stream is the first token.
 */
export class PeakEwma implements RoutingPolicy {
  readonly name = 'peak-ewma'
  private readonly cost = new Map<NodeState, { ewmaMs: number; atMs: number }>()
  constructor(
    private readonly rng: () => number,
    private readonly tauMs = 10_000,
  ) {}
  private score(c: Candidate) {
    const e = this.cost.get(c.node)
    return (e?.ewmaMs ?? 0) * (c.node.inFlight + 1) + (e ? 0 : -1) // untried nodes first
  }
  choose(cands: readonly Candidate[], req: RouteRequest) {
    const ok = usable(cands, req)
    if (ok.length === 0) return soonestBack(cands, req)
    const a = ok[Math.floor(this.rng() * ok.length)]!
    const b = ok[Math.floor(this.rng() * ok.length)]!
    return this.score(a) <= this.score(b) ? a : b
  }
  started() {}
  private observe(node: NodeState, ms: number, nowMs: number) {
    const e = this.cost.get(node)
    if (!e) return void this.cost.set(node, { ewmaMs: ms, atMs: nowMs })
    if (ms > e.ewmaMs) e.ewmaMs = ms
    else {
      const w = Math.exp(-(nowMs - e.atMs) / this.tauMs)
      e.ewmaMs = e.ewmaMs * w + ms * (1 - w)
    }
    e.atMs = nowMs
  }
  firstChunk(a: Attempt, nowMs: number) {
    this.observe(a.candidate.node, nowMs - a.startedAtMs, nowMs)
  }
  ended(a: Attempt, nowMs: number, outcome: Outcome) {
    if (outcome === 'failed' || outcome === 'overloaded') this.observe(a.candidate.node, 10_000, nowMs)
  }
}

/**
 * LiteLLM's latency-based routing (litellm/router_strategy/lowest_latency.py, RoutingArgs
 * defaults: lowest_latency_buffer 0, max_latency_list_size 10), as written:
 * - on success it records, per deployment, the latency and (streams) the time to first token,
 *   each divided by the completion tokens; a list that is full keeps its first 9 entries and
 *   replaces only the last (`list[:size-1] + [value]`);
 * - on a timeout it records a latency of 1000;
 * - a deployment never used counts latency 0 (so it is tried first);
 * - it averages the TTFT list for streams (dividing by the latency list's length, as the source
 *   does) and picks the lowest, at random among equals (buffer 0).
 * No load term: that is the policy.
 */
export class LiteLlmLatency implements RoutingPolicy {
  readonly name = 'litellm-latency'
  private readonly lists = new Map<NodeState, { latency: number[]; ttft: number[] }>()
  constructor(
    private readonly rng: () => number,
    private readonly size = 10,
  ) {}
  choose(cands: readonly Candidate[], req: RouteRequest) {
    const ok = usable(cands, req)
    if (ok.length === 0) return soonestBack(cands, req)
    let best: Candidate[] = []
    let bestAvg = Number.POSITIVE_INFINITY
    for (const c of ok) {
      const l = this.lists.get(c.node)
      let avg = 0
      if (l) {
        const src = req.stream && l.ttft.length > 0 ? l.ttft : l.latency
        avg = src.reduce((s, x) => s + x, 0) / Math.max(1, l.latency.length)
      }
      if (avg < bestAvg) {
        bestAvg = avg
        best = [c]
      } else if (avg === bestAvg) best.push(c)
    }
    return best[Math.floor(this.rng() * best.length)]
  }
  started() {}
  firstChunk() {}
  private push(list: number[], v: number) {
    if (list.length < this.size) list.push(v)
    else list[this.size - 1] = v
  }
  ended(a: Attempt, nowMs: number, outcome: Outcome, _cached: number | undefined, completion?: number) {
    let l = this.lists.get(a.candidate.node)
    if (!l) {
      l = { latency: [], ttft: [] }
      this.lists.set(a.candidate.node, l)
    }
    if (outcome === 'failed') return this.push(l.latency, 1000)
    if (outcome !== 'ok') return
    const tokens = Math.max(1, completion ?? 1)
    this.push(l.latency, (nowMs - a.startedAtMs) / 1000 / tokens)
    if (a.firstAtMs !== undefined) this.push(l.ttft, (a.firstAtMs - a.startedAtMs) / 1000 / tokens)
  }
}

/**
 * SGLang's router, cache_aware policy (sgl-router; defaults cache_threshold 0.5,
 * balance_abs_threshold 32, balance_rel_threshold 1.0001): when the loads (requests in flight)
 * are imbalanced - max - min > abs and max > rel x min - it picks the least loaded node;
 * otherwise the node whose approximate tree matches the most of the request, if the match is
 * over the threshold, else the node with the smallest tree; the request then goes into that
 * node's tree. SGLang's tree is a character radix tree of the request text; here it is the
 * same prefix blocks Tropa uses (an LRU per node of 256-character block hashes), sized like
 * SGLang's max_tree_size of 2^24 characters.
 */
export class SglangCacheAware implements RoutingPolicy {
  readonly name = 'sglang-cache-aware'
  private readonly trees = new Map<NodeState, PrefixIndex>()
  constructor(
    private readonly cacheThreshold = 0.5,
    private readonly absThreshold = 32,
    private readonly relThreshold = 1.0001,
    private readonly treeBlocks = 2 ** 24 / 256,
  ) {}
  private tree(n: NodeState) {
    let t = this.trees.get(n)
    if (!t) {
      t = new PrefixIndex(this.treeBlocks)
      this.trees.set(n, t)
    }
    return t
  }
  choose(cands: readonly Candidate[], req: RouteRequest) {
    const ok = usable(cands, req)
    if (ok.length === 0) return soonestBack(cands, req)
    const loads = ok.map((c) => c.node.inFlight)
    const max = Math.max(...loads)
    const min = Math.min(...loads)
    if (max - min > this.absThreshold && max > this.relThreshold * min) return ok[loads.indexOf(min)]!
    let best = ok[0]!
    let bestMatch = -1
    for (const c of ok) {
      const m = this.tree(c.node).match(req.prefix)
      if (m > bestMatch) {
        bestMatch = m
        best = c
      }
    }
    const rate = req.prefix.length === 0 ? 0 : bestMatch / req.prefix.length
    if (rate > this.cacheThreshold) return best
    let smallest = ok[0]!
    for (const c of ok) if (this.tree(c.node).size < this.tree(smallest.node).size) smallest = c
    return smallest
  }
  started(a: Attempt) {
    this.tree(a.candidate.node).insert(a.req.prefix)
  }
  firstChunk() {}
  ended() {}
}
