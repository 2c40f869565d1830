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
  type NodeMetrics,
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
 * SGLang's router, cache_aware policy (sgl-router/src/policies/cache_aware.rs): when the loads
 * (requests in flight at the router) are imbalanced - max - min > abs and max > rel x min - it
 * picks the least loaded node; otherwise the node whose approximate tree matches the most of
 * the request, if the match rate is over the threshold, else the node with the smallest tree;
 * the request then goes into that node's tree. Today's defaults
 * (sgl-router/py_src/sglang_router/router_args.py): cache_threshold 0.3, balance_abs_threshold
 * 64, balance_rel_threshold 1.5, eviction every 120 s down to max_tree_size 2^26 characters
 * per node; v0.4's were 0.5, 32, 1.0001 and 2^24. SGLang's tree is a character radix tree of
 * the request text; here it is the same 256-character prefix blocks Tropa indexes (an exact
 * prefix set per node), trimmed to the size limit only at each eviction.
 */
export class SglangCacheAware implements RoutingPolicy {
  private readonly trees = new Map<NodeState, PrefixIndex>()
  private lastEvictionMs = 0
  constructor(
    readonly name = 'sglang-cache-aware',
    private readonly cacheThreshold = 0.3,
    private readonly absThreshold = 64,
    private readonly relThreshold = 1.5,
    private readonly treeBlocks = 2 ** 26 / 256,
    private readonly evictionEveryMs = 120_000,
  ) {}
  private tree(n: NodeState) {
    let t = this.trees.get(n)
    if (!t) {
      t = new PrefixIndex(Number.MAX_SAFE_INTEGER)
      this.trees.set(n, t)
    }
    return t
  }
  choose(cands: readonly Candidate[], req: RouteRequest) {
    if (req.nowMs - this.lastEvictionMs >= this.evictionEveryMs) {
      this.lastEvictionMs = req.nowMs
      for (const t of this.trees.values()) t.trim(this.treeBlocks)
    }
    const ok = usable(cands, req)
    if (ok.length === 0) return soonestBack(cands, req)
    // The loads of every worker, healthy or not, as the source reads them.
    let max = 0
    let min = Number.POSITIVE_INFINITY
    for (const c of cands) {
      max = Math.max(max, c.node.inFlight)
      min = Math.min(min, c.node.inFlight)
    }
    if (max - min > this.absThreshold && max > this.relThreshold * min) {
      let least = ok[0]!
      for (const c of ok) if (c.node.inFlight < least.node.inFlight) least = c
      return least
    }
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

/** The bench's request: besides Tropa's 64-token blocks, the 16-token ones some peers hash. */
export interface BenchRouteRequest extends RouteRequest {
  /** Chained hashes of the prompt's 16-token blocks (64 characters at 4 characters a token). */
  readonly fine: readonly number[]
}
/**
 * The peers' fine blocks; in the real request path (bench/routing-http.ts), which hashes only
 * Tropa's 256-character blocks, those stand in for them.
 */
const fineOf = (req: RouteRequest) => (req as Partial<BenchRouteRequest>).fine ?? req.prefix

/**
 * llm-d's / the Gateway API Inference Extension's endpoint picker, default scheduling profile
 * (config/charts/inferencepool/templates/epp-config.yaml): queue-scorer weight 2,
 * kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score-picker. Each scorer gives
 * 0..1 per pod, the picker takes the highest weighted sum, ties at random (it shuffles first).
 * - queue (plugins/queuescorer/queue.go): min-max of the waiting queue over the pods, 1 for all
 *   when equal;
 * - KV cache (plugins/kvcacheutilizationscorer/kvcache_utilization.go): 1 - KV-cache use;
 * - prefix (plugins/prefixcachescorer/plugin.go, indexer.go): blocks of 64 characters (with
 *   autoTune, the pod's block size of 16 tokens x 4 characters), at most 256 per request,
 *   chained hashes; an LRU index per pod sized to the pod's GPU blocks (autoTune, from
 *   `vllm:cache_config_info`), written when a request is sent; score = matched / total blocks.
 * Metrics come from each pod's /metrics every 50 ms (pkg/epp/server/runserver.go,
 * DefaultRefreshMetricsInterval); between polls the scorers see the last values.
 */
export class LlmdEndpointPicker implements RoutingPolicy {
  readonly name = 'llm-d-epp'
  private readonly metrics = new Map<NodeState, { waiting: number; kv: number; blocks: number }>()
  private readonly index = new Map<NodeState, PrefixIndex>()
  constructor(
    private readonly rng: () => number,
    private readonly weights = { queue: 2, kv: 2, prefix: 3 },
    private readonly maxBlocks = 256,
  ) {}
  private indexOf(n: NodeState) {
    let t = this.index.get(n)
    if (!t) {
      t = new PrefixIndex(this.metrics.get(n)?.blocks ?? 31_250)
      this.index.set(n, t)
    }
    return t
  }
  choose(cands: readonly Candidate[], req: RouteRequest) {
    const ok = usable(cands, req)
    if (ok.length === 0) return soonestBack(cands, req)
    const fine = fineOf(req)
    const hashes = fine.length > this.maxBlocks ? fine.slice(0, this.maxBlocks) : fine
    let qMin = Number.POSITIVE_INFINITY
    let qMax = Number.NEGATIVE_INFINITY
    for (const c of ok) {
      const w = this.metrics.get(c.node)?.waiting ?? 0
      qMin = Math.min(qMin, w)
      qMax = Math.max(qMax, w)
    }
    let best: Candidate[] = []
    let bestScore = Number.NEGATIVE_INFINITY
    for (const c of ok) {
      const m = this.metrics.get(c.node)
      const w = m?.waiting ?? 0
      const queue = qMax === qMin ? 1 : (qMax - w) / (qMax - qMin)
      const kv = 1 - (m?.kv ?? 0)
      const prefix = hashes.length === 0 ? 0 : this.indexOf(c.node).match(hashes) / hashes.length
      const score = this.weights.queue * queue + this.weights.kv * kv + this.weights.prefix * prefix
      if (score > bestScore) {
        bestScore = score
        best = [c]
      } else if (score === bestScore) best.push(c)
    }
    return best[Math.floor(this.rng() * best.length)]
  }
  started(a: Attempt) {
    const fine = fineOf(a.req)
    this.indexOf(a.candidate.node).insert(fine.length > this.maxBlocks ? fine.slice(0, this.maxBlocks) : fine)
  }
  firstChunk() {}
  ended() {}
  nodeMetrics(node: NodeState, m: NodeMetrics & { cacheBlocks?: number }) {
    this.metrics.set(node, { waiting: m.waiting, kv: m.kvUsage ?? 0, blocks: m.cacheBlocks ?? 31_250 })
  }
}

/**
 * vLLM production-stack's `prefixaware` router (src/vllm_router/routers/routing_logic.py,
 * PrefixAwareRouter; src/vllm_router/prefix/hashtrie.py): a trie of the prompt's 128-character
 * chunks with the endpoints that were sent each path, never evicted; a request goes to a random
 * endpoint among those holding its longest matched prefix (all endpoints when nothing matches),
 * and its chunks are then recorded for that endpoint. No load term. Here the chunks are the
 * 16-token blocks (an exact prefix set per node).
 */
export class VllmPrefixAware implements RoutingPolicy {
  readonly name = 'vllm-prefixaware'
  private readonly seen = new Map<NodeState, Set<number>>()
  constructor(private readonly rng: () => number) {}
  private setOf(n: NodeState) {
    let s = this.seen.get(n)
    if (!s) {
      s = new Set()
      this.seen.set(n, s)
    }
    return s
  }
  choose(cands: readonly Candidate[], req: RouteRequest) {
    const ok = usable(cands, req)
    if (ok.length === 0) return soonestBack(cands, req)
    const fine = fineOf(req)
    let best: Candidate[] = []
    let bestLen = -1
    for (const c of ok) {
      const s = this.setOf(c.node)
      let n = 0
      while (n < fine.length && s.has(fine[n]!)) n++
      if (n > bestLen) {
        bestLen = n
        best = [c]
      } else if (n === bestLen) best.push(c)
    }
    return best[Math.floor(this.rng() * best.length)]
  }
  started(a: Attempt) {
    const s = this.setOf(a.candidate.node)
    for (const h of fineOf(a.req)) s.add(h)
  }
  firstChunk() {}
  ended() {}
}

/**
 * vLLM production-stack's `session` router (routing_logic.py, SessionRouter): a consistent hash
 * ring (uhashring; 160 points per endpoint here) maps the session key to an endpoint; requests
 * without one go to the endpoint with the lowest QPS over the request-stats window (60 s,
 * `--request-stats-window`, src/vllm_router/parsers/parser.py), an endpoint without requests yet
 * first. No load term for sessions.
 */
export class VllmSession implements RoutingPolicy {
  readonly name = 'vllm-session'
  private ring: { h: number; node: NodeState }[] = []
  private ringOf: readonly Candidate[] | undefined
  private readonly starts = new Map<NodeState, number[]>()
  constructor(private readonly windowMs = 60_000) {}
  private hash(s: string) {
    let h = 0x811c9dc5
    for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193)
    h = Math.imul(h ^ (h >>> 15), 0x85ebca6b)
    return (Math.imul(h ^ (h >>> 13), 0xc2b2ae35) ^ (h >>> 16)) >>> 0
  }
  choose(cands: readonly Candidate[], req: RouteRequest) {
    const ok = usable(cands, req)
    if (ok.length === 0) return soonestBack(cands, req)
    if (req.session !== undefined) {
      if (this.ringOf !== cands) {
        this.ringOf = cands
        this.ring = cands
          .flatMap((c) =>
            Array.from({ length: 160 }, (_, i) => ({ h: this.hash(`${c.node.name}-${i}`), node: c.node })),
          )
          .sort((a, b) => a.h - b.h)
      }
      const h = this.hash(req.session)
      let lo = 0
      let hi = this.ring.length
      while (lo < hi) {
        const mid = (lo + hi) >> 1
        if (this.ring[mid]!.h < h) lo = mid + 1
        else hi = mid
      }
      const node = this.ring[lo % this.ring.length]!.node
      const c = ok.find((x) => x.node === node)
      if (c) return c
    }
    let best: Candidate | undefined
    let bestQps = Number.POSITIVE_INFINITY
    for (const c of ok) {
      const list = this.starts.get(c.node)
      if (!list) return c
      while (list.length > 0 && list[0]! <= req.nowMs - this.windowMs) list.shift()
      if (list.length < bestQps) {
        bestQps = list.length
        best = c
      }
    }
    return best
  }
  started(a: Attempt) {
    let list = this.starts.get(a.candidate.node)
    if (!list) {
      list = []
      this.starts.set(a.candidate.node, list)
    }
    list.push(a.startedAtMs)
  }
  firstChunk() {}
  ended() {}
}
