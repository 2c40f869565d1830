import { SlotTable } from '../slot-table.ts'
import type { Candidate, NodeState } from './nodes.ts'
import {
  type Attempt,
  admissible,
  type NodeMetrics,
  type Outcome,
  type RouteRequest,
  type RoutingPolicy,
  soonestBack,
  type Warmup,
} from './policy.ts'
import { PrefixIndex } from './prefix.ts'
import { RatioQuantile } from './quantile.ts'

export interface PredictedTtftOptions {
  /** Uniform [0, 1) numbers; seeded in the benchmark. */
  readonly rng: () => number
  /** Prefill rate assumed for a node never observed, tokens/s. */
  readonly priorTokensPerSec: number
  /** Inter-token latency assumed before one is observed, ms. */
  readonly priorItlMs: number
  /**
   * Weight of the decoding requests in the prediction: gamma in `gamma * D * itl`. A continuous
   * batching engine adds about itl/20 to every iteration per decoding sequence, hence 0.05.
   */
  readonly gamma: number
  /** Random nodes sampled besides the best prefix matches (power-of-two choices), on fleets larger than `scanAll`. */
  readonly sampled: number
  /**
   * Fleets of up to this many admissible nodes are predicted in full (each prediction is a few
   * multiplications; the prefix match already visits every node). Larger ones are sampled.
   */
  readonly scanAll: number
  /**
   * A node with requests outstanding and no first token or end for longer than
   * max(stallMinMs, 3 x the prefill of an average queued request) is taken for stalled: priced
   * out until it answers.
   */
  readonly stallMinMs: number
  /** How long a node suspected of a stall stays priced by its silence with nothing sent to it, ms. */
  readonly suspectMaxMs: number
  /** Prefix index size per node, in blocks. */
  readonly indexBlocks: number
  /** Time constant of the rate's recovery after a drop, ms (drops apply at once). */
  readonly recoveryMs: number
  /** Nodes predicted within this share of the best are a tie, won by the one sent to longest ago. */
  readonly tieShare: number
  /** A session's previous node wins when predicted within this factor of the best. */
  readonly sessionSlack: number
  /**
   * A new session's first request ignores cached prefixes when they draw it to a node decoding
   * more than this many requests above the least busy candidate, or more than
   * `sessionSpreadPerKTokens` per 1000 tokens of the prefix cached there, if that is more:
   * spreading repeats the prefix's prefill, and a long one is worth a busier node.
   */
  readonly sessionSpread: number
  readonly sessionSpreadPerKTokens: number
  /**
   * The same two where a spread session's new node is warmed (`warmSessions`): its first turn no
   * longer pays the prefix's prefill, so the popular prefix spreads at a smaller excess.
   */
  readonly sessionSpreadWarm: number
  readonly sessionSpreadPerKTokensWarm: number
  /**
   * A new session spread away from the node holding its cached prefix (above) has this request
   * served on that node when it is predicted sooner there, and its new node warmed with the same
   * prompt (`takeWarmup`; routes with `warm_sessions`): the session's later turns find their
   * prefix cached at its new node, and its first turn does not wait for the prefix's prefill.
   */
  readonly warmSessions: boolean
  /**
   * A node never measured (no rate sample of its own, no measured twin) is priced at the prior;
   * chosen so, a request whose prompt would teach its rate is served instead on the best node
   * that is measured, when that one is predicted within this factor of it, and the unmeasured node
   * is warmed with the prompt (`takeWarmup`, where warm-ups are on): the warm-up's first token
   * measures it, and no client's request pays a slow node's prefill to find out. 0: off.
   */
  readonly exploreSlack: number
  /** At most one such warm-up per node in this long, ms. */
  readonly exploreEveryMs: number
  /**
   * First tokens that waited on fewer uncached tokens than this do not teach the prefill rate:
   * the fixed cost of a step outweighs the prefill in them.
   */
  readonly minRateSampleTokens: number
  /**
   * Nor do first tokens whose wait the decode steps of the prediction (`decodeStepsMs`) make
   * more than this share of: the inter-token latency learned under load counts prefill chunks
   * and queueing too, and what it leaves of such a wait is noise (under a burst, rates of
   * several times the node's real one, then dips, and identical nodes priced far apart).
   */
  readonly maxDecodeShare: number
  /**
   * While a batch could have a node (`RouteRequest.batchQuietMs` set: a batch wants nodes and
   * the fleet's interactive load leaves it one), a node that is the batch's (quiet: no
   * interactive request in flight nor lately, or running batch lines and no interactive request)
   * is priced this much higher:
   * interactive requests stay on nodes already serving interactive traffic unless those would be
   * slower by more than this factor, so that at low load the batch gets whole nodes (taking one
   * back pre-empts its lines).
   */
  readonly batchNodeFactor: number
  /**
   * A node the batch scheduler's packing plan gave the batch whole (`NodeState.batchHeld`) is
   * priced this much higher: interactive requests go there only when the nodes kept for them are
   * full or would be this much slower (the plan itself takes a node back as the load rises).
   */
  readonly batchHeldFactor: number
  /**
   * A first token on a node whose batch lines were pre-empted up to this long before its request
   * was sent (or after) teaches no prefill rate: it waited for the lines' engine iteration under
   * way, not for the node (priced down, the node would lose interactive traffic to the others,
   * longer decode steps there, for the ~10 s of a dip's recovery).
   */
  readonly preemptSettleMs: number
  /**
   * Hedge a streamed request when its first chunk is later than this quantile of observed/predicted
   * TTFT times the prediction (and at least `hedgeMinMs` after it started).
   */
  readonly hedgeQuantile: number
  readonly hedgeMinMs: number
  /** Nor earlier than this share of the runner-up node's prediction when it was chosen. */
  readonly hedgeAltShare: number
  /**
   * A node where streams of ours are decoding, silent (no first chunk or end) since its /metrics
   * (waiting, running, KV-cache use) last moved, and whose /metrics have not moved for
   * max(`frozenMinMs`, this many inter-token times) is taken for hung (suspect, as a stall): a
   * decoding sequence fills a 16-token cache block in 16 of them, and KV use moves with it.
   * (`frozenMinMs` spans two polls at the shipped 1 s, so one long prefill step is no hang.)
   */
  readonly frozenTokens: number
  readonly frozenMinMs: number
  /**
   * A node's /metrics `waiting` counts as a queue for slots (the slot wait in the prediction)
   * only when this many polls in a row show requests waiting: an engine shows a request that
   * arrived during a step as waiting until the step ends, with slots free, and one such poll
   * priced the node (a prefix's holder, say) seconds up until the next.
   */
  readonly slotWaitPolls: number
  /**
   * When the prediction puts a request off the nodes holding its longest prefix match (at least
   * this many blocks), a holder is priced again with its queue credited with the prefill done
   * since it started (the queue's head is partly prefilled, which the queued tokens alone do not
   * say), and wins when that is sooner. Not when an attempt sent there without a first token
   * yet shares the prefix: its blocks are still being computed, and a request admitted before
   * they are computes them again behind it. 0: off.
   */
  readonly holderCreditBlocks: number
  /**
   * A rate learned at a request's end (its first token seconds before) that is lower than the
   * node's dips it from now only when the node is slow next to the fleet: the sample over the
   * node's rate below this share of the median such ratio of the fleet's recent first tokens.
   * Otherwise the whole fleet was slow then (a burst filling every node's slots): the dip is
   * dated at the first token, and has mostly recovered by the end.
   */
  readonly fleetSlowShare: number
  /**
   * A first token that teaches no rate (fewer queued tokens than `minRateSampleTokens`, or a wait
   * mostly decode steps: `maxDecodeShare`) that came this many times later than the node's speed
   * predicted (past the round trip), at least one inter-token time late, and this many times the
   * fleet's recent median such factor, prices its node's
   * whole prediction up by that factor, recovering as a rate's dip does: a node slowed down
   * under short uncached suffixes (a cached system prompt, a chat turn) shows it at its next
   * first token, not at the end of its streams. 0: off.
   */
  readonly slowShare: number
  /** The most a slowness factor prices a node up (as a 429 prices it down, 8x). */
  readonly maxSlowness: number
  /**
   * A slow rate sample whose first token came longer ago than this (a long answer's end) dips
   * its node from that first token, recovering since, even when the node was slow alone: a
   * burst's slot-bound first token reported at the end of its answer seconds later priced its
   * node out at the start of the next burst.
   */
  readonly staleSampleMs: number
}

export const DEFAULT_PREDICTED_OPTIONS: Omit<PredictedTtftOptions, 'rng'> = {
  priorTokensPerSec: 8_000,
  priorItlMs: 25,
  gamma: 0.05,
  sampled: 2,
  scanAll: 32,
  stallMinMs: 1000,
  suspectMaxMs: 30_000,
  indexBlocks: 32_768,
  recoveryMs: 10_000,
  tieShare: 0.1,
  sessionSlack: 1.15,
  sessionSpread: 2,
  sessionSpreadPerKTokens: 3,
  sessionSpreadWarm: 1,
  sessionSpreadPerKTokensWarm: 1.5,
  warmSessions: true,
  exploreSlack: 1.5,
  exploreEveryMs: 10_000,
  minRateSampleTokens: 512,
  maxDecodeShare: 0.5,
  batchNodeFactor: 1.1,
  batchHeldFactor: 3,
  preemptSettleMs: 250,
  hedgeQuantile: 0.95,
  hedgeMinMs: 50,
  hedgeAltShare: 2,
  frozenTokens: 24,
  frozenMinMs: 1500,
  fleetSlowShare: 0.5,
  slowShare: 2,
  maxSlowness: 8,
  staleSampleMs: 2_000,
  slotWaitPolls: 2,
  holderCreditBlocks: 8,
}

/** What the policy has learned about one node. */
export class NodeModel {
  /** Uncached prompt tokens sent and not yet answered with a first chunk (P). */
  queuedTokens = 0
  /** Since when the queue has been prefilling: when it last became non-empty, or its last first chunk. */
  queueSinceMs = 0
  /** Attempts sent here without a first chunk yet (each keeps its slot: `Attempt.pendingSlot`). */
  readonly pending = new SlotTable<Attempt>()
  /** Requests past their first chunk and not ended (D). */
  decoding = 0
  /** Requests sent and not answered yet (non-streamed ones stay here until they end). */
  waiting = 0
  /** Prefill rate, tokens/s, as the samples say over time (before the first: the prior, or a twin's). */
  baseRate: number
  private sampled = false
  /** Whether a finished stream here gave an inter-token latency yet. */
  itlSampled = false
  /** The KV cache's size in blocks, from /metrics (vLLM's `cache_config_info`), if reported. */
  cacheBlocks: number | undefined
  /** Not measured, and priced at its measured twins' rate, not the prior (`PredictedTtft.applyTwin`). */
  twinned = false
  /** When a warm-up was last sent to measure it (`exploreSlack`). */
  exploredAtMs = Number.NEGATIVE_INFINITY
  /** A dip below the base rate (a slow sample, a 429), recovering towards it with time. */
  private dipRate = Number.POSITIVE_INFINITY
  private dipAtMs = 0
  /** A slowdown seen in short first tokens (`slowShare`): the factor, and since when it recovers. */
  private slowDip = 1
  private slowAtMs = 0
  /** Inter-token latency, ms, EWMA over finished streams. */
  itlMs: number
  /** Round-trip time floor: the smallest tiny-prompt TTFT seen, refreshed every 30 s. */
  rttMs = 0
  private rttWindowMin = Number.POSITIVE_INFINITY
  private rttWindowStart = 0
  /** How often a predicted prefix hit is real (actual cached / predicted cached), EWMA. */
  hitRatio = 1
  /** From /metrics: requests the node itself has waiting for a slot. */
  metricWaiting = 0
  /** Polls in a row, up to the last, that showed requests waiting. */
  waitingPolls = 0
  metricRunning = 0
  /** Requests of ours outstanding there (sent, not ended) at its last /metrics. */
  metricOwn = 0
  metricAtMs = Number.NEGATIVE_INFINITY
  /** Time from dispatch to end of a request here, ms, EWMA: how long a slot stays taken. */
  serviceMs = 0
  readonly index: PrefixIndex
  /** Requests routed here (first attempts and failovers) and first chunks seen. */
  routed = 0
  /** When a request was last sent here, ms. */
  lastSentMs = Number.NEGATIVE_INFINITY
  firstChunks = 0
  /** The most recent first-token times here, ms (the fleet view's percentiles). */
  readonly ttft = new RatioQuantile(256, 1)
  /** The last sign of life: a first chunk or an end here, or a dispatch to it while it had nothing outstanding. */
  lastProgressMs = 0
  /**
   * Set when requests were abandoned here in silence (no first token, none since): the node
   * stays priced by its silence with nothing outstanding, until it shows life (a first chunk, an
   * end, its /metrics moving from `suspectMetrics`) or `suspectMaxMs` passes.
   */
  suspectAtMs: number | undefined
  suspectMetrics: string | undefined
  /** The last first chunk or end seen from here, ms. */
  heardMs = Number.NEGATIVE_INFINITY
  /** The last /metrics as a string, and since when they have read so. */
  metricKey: string | undefined
  metricSinceMs = 0

  constructor(
    readonly node: NodeState,
    opts: Omit<PredictedTtftOptions, 'rng'>,
    private readonly recoveryMs = opts.recoveryMs,
  ) {
    this.baseRate = opts.priorTokensPerSec
    this.itlMs = opts.priorItlMs
    this.index = new PrefixIndex(opts.indexBlocks)
  }

  /**
   * The prefill rate R to predict with: peak-sensitive. A slower sample or an overload applies
   * at once; recovery to the base rate takes about `recoveryMs`, with or without traffic, so
   * a node priced out by one bad moment gets tried again.
   */
  rate(nowMs: number): number {
    if (this.dipRate >= this.baseRate) return this.baseRate
    return this.recovered(this.dipRate, this.baseRate, this.dipAtMs, nowMs)
  }

  /** A value moved from `to` to `from` at `atMs`, on its way back: about `recoveryMs` to return. */
  private recovered(from: number, to: number, atMs: number, nowMs: number): number {
    const w = 1 - Math.exp(-Math.max(0, nowMs - atMs) / this.recoveryMs)
    return from + (to - from) * w
  }

  /**
   * What the prediction past the round trip is multiplied by: a slowdown seen in first tokens
   * that teach no rate, recovering towards 1 as the rate's dips do.
   */
  slowness(nowMs: number): number {
    if (this.slowDip <= 1) return 1
    return this.recovered(this.slowDip, 1, this.slowAtMs, nowMs)
  }

  /** A first token's lateness, as a slowness factor (`PredictedTtft.observeShort`): it applies from now. */
  observeSlowness(factor: number, nowMs: number): void {
    this.slowDip = Math.max(1, factor)
    this.slowAtMs = nowMs
  }

  /** Whether a request's end here gave a rate sample yet. */
  get measured(): boolean {
    return this.sampled
  }

  /** A measured rate; one below the current rate dips it, from `dipAtMs` (the time it describes). */
  observeRate(sample: number, nowMs: number, dipAtMs = nowMs): void {
    if (!(sample > 0) || !Number.isFinite(sample)) return
    if (!this.sampled) {
      this.sampled = true
      this.twinned = false
      this.baseRate = sample
    } else this.baseRate += (sample - this.baseRate) * 0.1
    if (sample < this.rate(nowMs)) this.dip(sample, dipAtMs)
  }

  /**
   * Prices the node down to `rate` now (recovering with time). A slowness seen before is
   * dropped: the dip is the newer measure of the same node, and both would price it twice.
   */
  dip(rate: number, nowMs: number): void {
    this.dipRate = rate
    this.dipAtMs = nowMs
    this.slowDip = 1
  }

  /** The network floor: a minimum over 30 s windows, kept from the last full window. */
  observeRtt(sampleMs: number, nowMs: number): void {
    if (nowMs - this.rttWindowStart > 30_000) {
      if (Number.isFinite(this.rttWindowMin)) this.rttMs = this.rttWindowMin
      this.rttWindowMin = Number.POSITIVE_INFINITY
      this.rttWindowStart = nowMs
    }
    this.rttWindowMin = Math.min(this.rttWindowMin, sampleMs)
    if (this.rttMs === 0 || sampleMs < this.rttMs) this.rttMs = sampleMs
  }
}

/**
 * Tropa's policy: send each request where its first token is predicted soonest.
 *
 *   ttft(node) = rtt + (P + n - h*m) / R + gamma * D * itl
 *
 * n prompt tokens, m of them predicted cached on the node (its prefix index), h how often such
 * predictions come true there, P uncached tokens queued there and not answered yet, D requests
 * decoding there, R its prefill rate learned from each first token. Candidates are the nodes
 * with the longest prefix match plus `sampled` random nodes, so many routers do not all pile
 * onto one node. A session's previous node wins near-ties.
 */

/** Values computed at most once a second per key (aggregates over the fleet), at most 4,096 keys. */
class SecondCache<K, V> {
  private readonly kept = new Map<K, { atMs: number; value: V }>()

  get(key: K, nowMs: number, compute: () => V): V {
    const k = this.kept.get(key)
    if (k !== undefined && nowMs >= k.atMs && nowMs - k.atMs < 1_000) return k.value
    const value = compute()
    this.kept.set(key, { atMs: nowMs, value })
    if (this.kept.size > 4_096) this.kept.delete(this.kept.keys().next().value!)
    return value
  }

  delete(key: K): void {
    this.kept.delete(key)
  }
}

export class PredictedTtft implements RoutingPolicy {
  readonly name: string
  private readonly opts: PredictedTtftOptions
  private readonly models = new Map<NodeState, NodeModel>()
  private readonly sessions = new Map<string, NodeState>()
  /** Per KV-cache size: its measured nodes' mean rate and ITL (`twinMean`). */
  private readonly twinMeans = new SecondCache<
    number,
    { rate: number; itlMs: number | undefined } | undefined
  >()
  private readonly ratio = new RatioQuantile()
  private metricsOn = false
  /** Recent first tokens' rate samples over their node's rate, all nodes. */
  private readonly fleetRatios = new RatioQuantile(32, 1)
  /** Recent slowness factors of first tokens that teach no rate, all nodes (`observeShort`). */
  private readonly fleetSlowness = new RatioQuantile(32, 1)
  /** The last `predict`'s speed term, ms (see there). */
  private lastSpeedMs = 0
  /** The prediction on the runner-up node of the last choice, for its attempt's hedge time. */
  private lastChoice: { req: RouteRequest; alternativeMs: number | undefined } | undefined

  constructor(opts: Partial<PredictedTtftOptions> & Pick<PredictedTtftOptions, 'rng'>, name = 'tropa') {
    this.opts = { ...DEFAULT_PREDICTED_OPTIONS, ...opts }
    this.name = name
  }

  forget(node: NodeState): void {
    const blocks = this.models.get(node)?.cacheBlocks
    if (blocks !== undefined) this.twinMeans.delete(blocks)
    this.models.delete(node)
  }

  model(node: NodeState): NodeModel {
    let m = this.models.get(node)
    if (!m) {
      m = new NodeModel(node, this.opts)
      this.models.set(node, m)
    }
    return m
  }

  /**
   * Predicted TTFT on a node for `n` prompt tokens of which `cached` are likely cached, ms. With
   * `credit`, the queue is taken as prefilling at the node's rate since `queueSinceMs`. What the
   * node's speed alone predicts past the round trip (no slowness, no silence) is left in
   * `lastSpeedMs` (read by `started`; a field, not an object per dispatch).
   */
  predict(m: NodeModel, n: number, cached: number, nowMs: number, credit = false): number {
    const slow = m.slowness(nowMs)
    const queued =
      credit && m.queuedTokens > 0
        ? Math.max(
            0,
            m.queuedTokens -
              (Math.max(0, nowMs - m.queueSinceMs - m.rttMs / 2) * m.rate(nowMs)) / slow / 1000,
          )
        : m.queuedTokens
    const lines = m.node.batchStarts.length > 0 ? this.batchPrefillLeft(m, nowMs) : 0
    let slotWaitMs = 0
    if (
      this.metricsOn &&
      nowMs - m.metricAtMs < 5_000 &&
      m.metricWaiting > 0 &&
      m.waitingPolls >= this.opts.slotWaitPolls
    ) {
      // The node has requests waiting for a slot (its own backlog or other routers' traffic):
      // each must wait for running ones to finish, about a service time per slot's worth. The
      // poll is up to a second old: requests of ours sent there since wait too, and ours that
      // ended since freed slots. (One poll showing some waiting is no backlog: an engine lists a
      // request that arrived during a step as waiting until the step ends, slots free or not.)
      const waiting = Math.max(0, m.metricWaiting + m.waiting + m.decoding - m.metricOwn)
      if (waiting > 0) slotWaitMs = ((waiting + 1) * m.serviceMs) / Math.max(1, m.metricRunning)
    }
    const uncached = Math.max(1, n - m.hitRatio * cached)
    const rate = m.rate(nowMs)
    const queueMs = ((queued + lines) * 1000) / rate
    const speedMs = slotWaitMs + queueMs + (uncached * 1000) / rate + this.decodeStepsMs(m.decoding, m.itlMs)
    this.lastSpeedMs = speedMs
    let t = m.rttMs + slow * speedMs
    // Silent for longer than the head of its queue could take (3x an average queued request's
    // prefill): stalled (hung, or a partition holding the connection). Its prediction grows by
    // 8x the silence so far, until it answers.
    if (m.waiting > 0 || this.suspect(m, nowMs)) {
      const silentMs = nowMs - m.lastProgressMs
      // A node given up on without a first token (suspect) is priced by its silence at once.
      const graceMs = this.suspect(m, nowMs) ? 0 : this.stallAfterMs(m, slow * queueMs)
      if (silentMs > graceMs) t += 8 * silentMs
    }
    return t
  }

  /**
   * Prompt tokens of the batch lines started on the node that its engine has likely not
   * prefilled yet, at the node's rate from when each reached it: a request sent now waits for them.
   */
  private batchPrefillLeft(m: NodeModel, nowMs: number): number {
    const rate = m.rate(nowMs)
    let freeAtMs = Number.NEGATIVE_INFINITY
    for (const s of m.node.batchStarts)
      freeAtMs = Math.max(s.atMs + m.rttMs / 2, freeAtMs) + (s.tokens * 1000) / rate
    return Math.max(0, ((freeAtMs - nowMs) * rate) / 1000)
  }

  /** How long a node with requests outstanding may be silent before it is taken for stalled, ms. */
  private stallAfterMs(m: NodeModel, queueMs: number): number {
    // Longer than the head of its queue could take (3x an average queued request's prefill).
    return Math.max(this.opts.stallMinMs, (3 * queueMs) / Math.max(1, m.waiting) + m.rttMs)
  }

  private suspect(m: NodeModel, nowMs: number): boolean {
    return m.suspectAtMs !== undefined && nowMs - m.suspectAtMs < this.opts.suspectMaxMs
  }

  /** A sign of life: the node is not stalled. */
  private alive(m: NodeModel, nowMs: number): void {
    m.lastProgressMs = nowMs
    m.suspectAtMs = undefined
  }

  choose(candidates: readonly Candidate[], req: RouteRequest): Candidate | undefined {
    // A warm-up is asked for by the choice just made, or by none.
    this.warm = undefined
    if (this.modelCandidates.get(req.modelId) !== candidates) {
      if (this.modelCandidates.size >= 4_096) this.modelCandidates.clear()
      this.modelCandidates.set(req.modelId, candidates)
    }
    const pool: Candidate[] = []
    const matched: number[] = []
    let bestMatch = 0
    for (const c of candidates) {
      if (!admissible(c, req)) continue
      const blocks = req.prefix.length > 0 ? this.model(c.node).index.match(req.prefix) : 0
      pool.push(c)
      matched.push(blocks)
      if (blocks > bestMatch) bestMatch = blocks
    }
    if (pool.length === 0) return soonestBack(candidates, req)
    if (pool.length === 1) return pool[0]

    const sessionNode = req.session !== undefined ? this.sessions.get(req.session) : undefined
    let sessionIdx = -1
    if (sessionNode) sessionIdx = pool.findIndex((c) => c.node === sessionNode)
    // Every node on a fleet of up to `scanAll`, from a random start so that equal predictions
    // spread; on larger ones the nodes holding the longest prefix plus a few at random.
    const picked: number[] = []
    if (pool.length <= this.opts.scanAll) {
      const start = Math.floor(this.opts.rng() * pool.length)
      for (let k = 0; k < pool.length; k++) picked.push((start + k) % pool.length)
    } else {
      const set = new Set<number>()
      if (bestMatch > 0) for (let i = 0; i < pool.length; i++) if (matched[i] === bestMatch) set.add(i)
      if (sessionIdx >= 0) set.add(sessionIdx)
      const want = Math.min(pool.length, set.size + this.opts.sampled)
      for (let tries = 0; set.size < want && tries < 4 * pool.length; tries++)
        set.add(Math.floor(this.opts.rng() * pool.length))
      picked.push(...set)
    }

    const newSession = req.session !== undefined && sessionNode === undefined
    let best = -1
    let bestTtft = Number.POSITIVE_INFINITY
    let sessionTtft = Number.POSITIVE_INFINITY
    const ts: number[] = []
    const batchNode: boolean[] = []
    const scan = (withCache: boolean) => {
      best = -1
      bestTtft = Number.POSITIVE_INFINITY
      for (const i of picked) {
        const c = pool[i]!
        const cached = withCache ? Math.min(matched[i]! * req.blockTokens, req.promptTokens - 1) : 0
        let t = this.predict(this.model(c.node), req.promptTokens, cached, req.nowMs) / c.route.weight
        if (req.batchQuietMs === undefined) {
          // No batch could have a node now (none runs, or the fleet is too busy for one): a node
          // running lines is priced as any other (an interactive request there pre-empts them).
          batchNode[i] = false
        } else if (c.node.batchHeld) {
          // Held for a batch while interactive load is low (batches.pack_share).
          t *= this.opts.batchHeldFactor
          batchNode[i] = true
        } else if (
          c.node.interactiveEverywhere === 0 &&
          (c.node.batchInFlight > 0 || c.node.quiet(req.nowMs, req.batchQuietMs))
        ) {
          t *= this.opts.batchNodeFactor
          batchNode[i] = true
        } else batchNode[i] = false
        if (i === sessionIdx) sessionTtft = t
        ts[i] = t
        if (t < bestTtft) {
          bestTtft = t
          best = i
        }
      }
      // Near-equal predictions go to the node sent to longest ago: identical nodes then get
      // their requests evenly spaced, as round-robin does, and the oldest queue is the likeliest
      // to be nearly done (the prediction sees tokens queued, not how far their prefill got).
      if (this.opts.tieShare > 0) {
        let oldest = this.model(pool[best]!.node).lastSentMs
        for (const i of picked) {
          const sent = this.model(pool[i]!.node).lastSentMs
          // (A batch's node is no tie: it is priced up so that it stays the batch's.)
          if (ts[i]! <= bestTtft * (1 + this.opts.tieShare) && sent < oldest && !batchNode[i]) {
            oldest = sent
            best = i
          }
        }
        bestTtft = ts[best]!
      }
    }
    scan(true)
    if (
      this.opts.holderCreditBlocks > 0 &&
      bestMatch >= this.opts.holderCreditBlocks &&
      matched[best]! < bestMatch
    ) {
      // Sent off the prefix's holders: price them again with their queues' progress credited.
      for (const i of picked) {
        if (matched[i] !== bestMatch || batchNode[i]) continue
        const t = this.holderTtft(this.model(pool[i]!.node), req, bestMatch)
        if (t !== undefined && t / pool[i]!.route.weight < ts[best]!) {
          ts[i] = t / pool[i]!.route.weight
          best = i
        }
      }
      bestTtft = ts[best]!
    }
    if (newSession) {
      // A new session settles where it starts: its turns will load that node. When the cached
      // prefix it would find (a system prompt all sessions share, say) draws it to a node busier
      // than the least busy by more than `sessionSpread` decoding requests, it is placed as if
      // nothing were cached, and so the popular prefix spreads instead of piling on one node.
      // Spreading repeats the prefix's prefill: a long prefix (an agent's 2k-token tool prompt)
      // takes a busier node before it spreads, `sessionSpreadPerKTokens` requests per 1k tokens.
      let minDecoding = Number.POSITIVE_INFINITY
      for (const i of picked) minDecoding = Math.min(minDecoding, this.model(pool[i]!.node).decoding)
      const cachedTokens = Math.min(matched[best]! * req.blockTokens, req.promptTokens - 1)
      // Warm-ups on (the holder's route stands for the fleet's): a spread costs the turn nothing.
      const warm = this.opts.warmSessions && this.warmable(pool[best]!)
      const spread = Math.max(
        warm ? this.opts.sessionSpreadWarm : this.opts.sessionSpread,
        ((warm ? this.opts.sessionSpreadPerKTokensWarm : this.opts.sessionSpreadPerKTokens) * cachedTokens) /
          1000,
      )
      if (this.model(pool[best]!.node).decoding > minDecoding + spread) {
        const holder = best
        const holderTtft = bestTtft
        scan(false)
        const home = pool[best]!
        if (
          this.opts.warmSessions &&
          this.warmable(home) &&
          home.node !== pool[holder]!.node &&
          holderTtft < bestTtft &&
          req.session !== undefined
        ) {
          // This turn where its prefix is cached; the session's new home, warmed with its prompt.
          this.warm = { candidate: home, session: req.session }
          best = holder
          bestTtft = holderTtft
        }
      }
    }
    if (sessionIdx >= 0 && sessionIdx !== best && sessionTtft <= bestTtft * this.opts.sessionSlack)
      best = sessionIdx
    // A node never measured, picked: measured by a warm-up, the request served on a measured node.
    let explored = -1
    if (this.opts.exploreSlack > 0 && this.warm === undefined && best !== sessionIdx && req.canExplore) {
      const alt = this.exploreAlternative(pool, picked, ts, batchNode, best, matched, req)
      if (alt >= 0) {
        explored = best
        best = alt
      }
    }
    let alternative = Number.POSITIVE_INFINITY
    for (const i of picked) if (i !== best && i !== explored && ts[i]! < alternative) alternative = ts[i]!
    this.lastChoice = { req, alternativeMs: Number.isFinite(alternative) ? alternative : undefined }
    return pool[best]
  }

  /**
   * `exploreSlack`: when `best` is a node never measured (no sample, no measured twin) holding
   * none of the prompt, whose prompt would teach its rate, the measured node to serve the request
   * on instead (within the slack, and the request's TTFT budget), with the node's warm-up asked
   * for; -1: the request goes to `best`. One warm-up per node every `exploreEveryMs`: while it
   * runs the node is avoided all the same; a node it did not measure (its first token taught no
   * rate) is then explored by a request, as without warm-ups.
   */
  private exploreAlternative(
    pool: readonly Candidate[],
    picked: readonly number[],
    ts: readonly number[],
    batchNode: readonly boolean[],
    best: number,
    matched: readonly number[],
    req: RouteRequest,
  ): number {
    const c = pool[best]!
    const m = this.model(c.node)
    if (m.measured || m.twinned || matched[best]! > 0 || !this.opts.warmSessions || !this.warmable(c))
      return -1
    if (req.promptTokens < this.opts.minRateSampleTokens) return -1
    const recent = req.nowMs - m.exploredAtMs < this.opts.exploreEveryMs
    if (recent && m.waiting === 0) return -1
    let alt = -1
    for (const i of picked) {
      if (i === best || batchNode[i]) continue
      const o = this.model(pool[i]!.node)
      if ((o.measured || o.twinned) && (alt < 0 || ts[i]! < ts[alt]!)) alt = i
    }
    if (alt < 0 || ts[alt]! > ts[best]! * this.opts.exploreSlack) return -1
    if (req.ttftBudgetMs !== undefined && ts[alt]! > req.ttftBudgetMs) return -1
    if (!recent) {
      m.exploredAtMs = req.nowMs
      this.warm = { candidate: c, session: undefined }
    }
    return alt
  }

  /** Whether a route's node may be warmed: `warm_sessions`, by default where it reports /metrics (a self-hosted engine). */
  private warmable(c: Candidate): boolean {
    return c.route.warmSessions ?? this.model(c.node).metricAtMs > Number.NEGATIVE_INFINITY
  }

  /**
   * A warm-up asked for by the last `choose`: a new session's new home, to warm with its first
   * prompt (`session` set), or a node never measured, to measure with the request's prompt.
   */
  private warm: { candidate: Candidate; session: string | undefined } | undefined

  takeWarmup(): Warmup | undefined {
    const w = this.warm
    this.warm = undefined
    return w && { candidate: w.candidate, reason: w.session === undefined ? 'explore' : 'session' }
  }

  /** The node a session's next turn is bound for (its home), if it has one. */
  sessionHome(session: string): NodeState | undefined {
    return this.sessions.get(session)
  }

  declineWarmup(a: Attempt, warmed?: NodeState): void {
    // Not warmed: the session lives where its first turn is served (unless it has moved on since).
    const s = a.req.session
    if (s === undefined || !this.sessions.has(s)) return
    if (warmed !== undefined && this.sessions.get(s) !== warmed) return
    this.sessions.set(s, a.candidate.node)
  }

  estimateTtftMs(c: Candidate, req: RouteRequest): number {
    const m = this.model(c.node)
    const blocks = req.prefix.length > 0 ? m.index.match(req.prefix) : 0
    // As `choose` prices a holder (deadline-aware admission asks about the node it chose).
    const held = this.holderTtft(m, req, blocks)
    if (held !== undefined) return held
    const cached = Math.min(blocks * req.blockTokens, Math.max(0, req.promptTokens - 1))
    return this.predict(m, req.promptTokens, cached, req.nowMs)
  }

  /**
   * The prediction on a node holding `blocks` of the request's prefix with its queue's progress
   * credited, or undefined when the match is short or still being prefilled there (an attempt
   * without a first token shares it).
   */
  private holderTtft(m: NodeModel, req: RouteRequest, blocks: number): number | undefined {
    if (this.opts.holderCreditBlocks <= 0 || blocks < this.opts.holderCreditBlocks) return undefined
    const sharing = m.pending.some((a) => {
      const p = a.req.prefix
      let k = 0
      while (k < blocks && k < p.length && p[k] === req.prefix[k]) k++
      return k >= blocks
    })
    if (sharing) return undefined
    const cached = Math.min(blocks * req.blockTokens, Math.max(0, req.promptTokens - 1))
    return this.predict(m, req.promptTokens, cached, req.nowMs, true)
  }

  started(a: Attempt): void {
    const m = this.model(a.candidate.node)
    const req = a.req
    const blocks = req.prefix.length > 0 ? m.index.match(req.prefix) : 0
    const cached = Math.min(blocks * req.blockTokens, Math.max(0, req.promptTokens - 1))
    a.predictedCachedTokens = cached
    a.predictedTtftMs = this.predict(m, req.promptTokens, cached, a.startedAtMs)
    a.predictedSpeedMs = this.lastSpeedMs
    if (this.lastChoice?.req === req) a.alternativeTtftMs = this.lastChoice.alternativeMs
    this.lastChoice = undefined
    a.queuedTokens = Math.max(1, req.promptTokens - m.hitRatio * cached)
    a.ownTokens = a.queuedTokens
    if (m.queuedTokens === 0) m.queueSinceMs = a.startedAtMs
    m.queuedTokens += a.queuedTokens
    a.pendingSlot = m.pending.add(a)
    a.queueAheadTokens = m.queuedTokens
    a.decodingAtStart = m.decoding
    // With nothing owed, the node's silence starts now; one that let requests go unanswered
    // still owes a first token, and its silence goes on.
    if (m.waiting === 0 && !this.suspect(m, a.startedAtMs))
      m.lastProgressMs = Math.max(m.lastProgressMs, a.startedAtMs)
    m.waiting++
    m.routed++
    m.lastSentMs = a.startedAtMs
    if (req.prefix.length > 0) m.index.insert(req.prefix)
    if (req.session !== undefined) {
      this.sessions.delete(req.session)
      const home = this.warm?.session === req.session ? this.warm.candidate.node : a.candidate.node
      this.sessions.set(req.session, home)
      if (this.sessions.size > 100_000) this.sessions.delete(this.sessions.keys().next().value!)
    }
  }

  firstChunk(a: Attempt, nowMs: number): void {
    if (a.firstAtMs !== undefined) return
    a.firstAtMs = nowMs
    const m = this.model(a.candidate.node)
    const ttft = nowMs - a.startedAtMs
    // (A warm-up's first token is no client's: not in the node's TTFT figures.)
    if (!a.warmup) m.ttft.add(ttft)
    const own = a.queuedTokens
    this.alive(m, nowMs)
    m.heardMs = nowMs
    this.dequeue(m, a)
    m.pending.delete(a.pendingSlot, a)
    m.queueSinceMs = nowMs
    m.decoding++
    a.decoding = true
    m.firstChunks++
    // Solve the prediction for R with what was known at dispatch: the tokens this first token
    // waited for (the queue ahead of it, its own included) over the time they took.
    const decodeMs = this.decodeStepsMs(a.decodingAtStart, m.itlMs)
    const prefillMs = ttft - m.rttMs - decodeMs
    const afterLines = a.startedAtMs - a.candidate.node.batchPreemptedAtMs <= this.opts.preemptSettleMs
    if (
      !afterLines &&
      prefillMs > 0 &&
      a.queueAheadTokens >= this.opts.minRateSampleTokens &&
      decodeMs <= this.opts.maxDecodeShare * (ttft - m.rttMs)
    ) {
      // The rate is learned at the end, when usage says how much of the prompt was cached
      // (predicted hits are often short of the node's); a sample far below the rate (a slowed
      // node) prices it down now.
      a.prefillMs = prefillMs
      const sample = (a.queueAheadTokens * 1000) / prefillMs
      if (sample < m.rate(nowMs) * 0.5) m.dip(sample, nowMs)
      this.fleetRatios.add(sample / m.baseRate)
    } else if (!afterLines && this.opts.slowShare > 0) this.observeShort(m, a, ttft, nowMs)
    // A tiny prompt on an idle node measures the network, not the prefill.
    if (a.queueAheadTokens <= own && own <= 64 && a.decodingAtStart === 0) m.observeRtt(ttft, nowMs)
    if (!afterLines && a.predictedTtftMs !== undefined && a.predictedTtftMs > 0)
      this.ratio.add(ttft / a.predictedTtftMs)
  }

  ended(
    a: Attempt,
    nowMs: number,
    outcome: Outcome,
    cachedTokens: number | undefined,
    completionTokens?: number,
  ): void {
    const m = this.model(a.candidate.node)
    m.pending.delete(a.pendingSlot, a)
    if (outcome === 'ok') {
      this.alive(m, nowMs)
      m.heardMs = nowMs
    }
    if (a.decoding) {
      m.decoding--
      a.decoding = false
      if (
        outcome === 'ok' &&
        completionTokens !== undefined &&
        completionTokens > 1 &&
        a.firstAtMs !== undefined
      ) {
        const itl = (nowMs - a.firstAtMs) / (completionTokens - 1)
        m.itlMs += (itl - m.itlMs) * 0.2
        m.itlSampled = true
      }
    } else this.dequeue(m, a)
    if (outcome === 'cancelled' && a.firstAtMs === undefined && m.suspectAtMs === undefined) {
      // Given up without a first token (a hedge won elsewhere, the client left): until the node
      // shows life its silence keeps counting with nothing outstanding there, so that it does
      // not look idle (its cached prefixes would draw traffic back into a stall).
      m.suspectAtMs = nowMs
      m.suspectMetrics = nowMs - m.metricAtMs < 5_000 ? m.metricKey : undefined
    }
    if (
      outcome === 'cancelled' &&
      a.firstAtMs === undefined &&
      nowMs - a.startedAtMs > Math.max(this.opts.stallMinMs, 2 * (a.predictedTtftMs ?? 0))
    ) {
      // Abandoned (a hedge won elsewhere, the client left) after waiting well past its
      // prediction without a first token: price the node out as for a 429, recovering with time.
      m.dip(m.rate(nowMs) / 8, nowMs)
    } else if (outcome === 'overloaded') {
      // 429/503: the node is full; price it out until its first tokens say otherwise.
      m.dip(m.rate(nowMs) / 8, nowMs)
    } else if (outcome === 'failed') {
      m.dip(m.rate(nowMs) / 2, nowMs)
      m.index.clear()
    }
    if (outcome === 'ok' && a.prefillMs !== undefined) {
      const own = Math.max(1, a.req.promptTokens - (cachedTokens ?? a.req.promptTokens - a.ownTokens))
      if (a.queueAheadTokens - a.ownTokens + own >= this.opts.minRateSampleTokens)
        this.observeEndRate(m, ((a.queueAheadTokens - a.ownTokens + own) * 1000) / a.prefillMs, a, nowMs)
      a.prefillMs = undefined
    }
    if (outcome === 'ok' && !a.warmup) {
      // (A warm-up's one token is no request's service time: slot waits would be priced low.)
      const took = nowMs - a.startedAtMs
      m.serviceMs = m.serviceMs === 0 ? took : m.serviceMs + (took - m.serviceMs) * 0.1
    }
    if (outcome === 'ok' && cachedTokens !== undefined && a.predictedCachedTokens > 0) {
      const sample = Math.min(1, cachedTokens / a.predictedCachedTokens)
      m.hitRatio += (sample - m.hitRatio) * 0.1
    }
  }

  nodeMetrics(node: NodeState, metrics: NodeMetrics, nowMs: number): void {
    this.metricsOn = true
    const m = this.model(node)
    m.cacheBlocks = metrics.cacheBlocks
    this.applyTwin(m, nowMs)
    m.metricWaiting = metrics.waiting
    m.waitingPolls = metrics.waiting > 0 ? m.waitingPolls + 1 : 0
    m.metricRunning = metrics.running
    m.metricAtMs = nowMs
    m.metricOwn = m.waiting + m.decoding
    const key = `${metrics.waiting}/${metrics.running}/${metrics.kvUsage}`
    if (key !== m.metricKey) {
      m.metricKey = key
      m.metricSinceMs = nowMs
      // A hung engine's gauges freeze; moving ones say it is working again.
      if (m.suspectAtMs !== undefined && m.suspectMetrics !== undefined && m.suspectMetrics !== key)
        this.alive(m, nowMs)
    } else if (
      m.suspectAtMs === undefined &&
      metrics.kvUsage !== undefined &&
      metrics.running > 0 &&
      m.decoding > 0 &&
      m.heardMs <= m.metricSinceMs &&
      nowMs - m.metricSinceMs > Math.max(this.opts.frozenMinMs, this.opts.frozenTokens * m.itlMs)
    ) {
      // Decoding requests of ours are there, and its KV-cache use has not moved for longer than
      // they take to fill a cache block (16 tokens): the engine is hung, though nothing of ours
      // is late for a first token. Suspect until it shows life.
      m.suspectAtMs = nowMs
      m.suspectMetrics = key
      m.lastProgressMs = Math.min(m.lastProgressMs, m.metricSinceMs)
    }
  }

  /**
   * A node not measured yet (no rate sample of its own) is priced at the mean rate, and
   * inter-token latency, of its measured twins: the nodes whose /metrics report the same KV-cache
   * size in blocks. vLLM sizes its cache from the memory left after loading the weights, so the
   * same figure almost always means the same accelerator serving the same model. Without a
   * measured twin (none yet, gone, or no size reported) the node has the priors.
   */
  private applyTwin(m: NodeModel, nowMs: number): void {
    if (m.measured) return
    const twin = m.cacheBlocks === undefined ? undefined : this.twinMean(m.cacheBlocks, nowMs)
    if (twin !== undefined) {
      m.baseRate = twin.rate
      if (!m.itlSampled && twin.itlMs !== undefined) m.itlMs = twin.itlMs
      m.twinned = true
    } else if (m.twinned) {
      m.baseRate = this.opts.priorTokensPerSec
      if (!m.itlSampled) m.itlMs = this.opts.priorItlMs
      m.twinned = false
    }
  }

  /** The measured nodes of a cache size, their mean rate and ITL; computed at most once a second. */
  private twinMean(blocks: number, nowMs: number): { rate: number; itlMs: number | undefined } | undefined {
    return this.twinMeans.get(blocks, nowMs, () => {
      let rate = 0
      let n = 0
      let itl = 0
      let itls = 0
      for (const o of this.models.values()) {
        if (!o.measured || o.cacheBlocks !== blocks) continue
        rate += o.baseRate
        n++
        if (o.itlSampled) {
          itl += o.itlMs
          itls++
        }
      }
      return n === 0 ? undefined : { rate: rate / n, itlMs: itls > 0 ? itl / itls : undefined }
    })
  }

  hedgeAtMs(a: Attempt): number | undefined {
    if (a.predictedTtftMs === undefined || !a.req.stream) return undefined
    // A router that has seen few first tokens does not know yet what late means.
    if (this.ratio.count < 20) return undefined
    const q = this.ratio.quantile(this.opts.hedgeQuantile)
    // A hedge is a fresh request elsewhere: never sent before a fresh one there was predicted to
    // answer (a late node holding the prefix still beats a cold one that starts now).
    const alt = (a.alternativeTtftMs ?? 0) * this.opts.hedgeAltShare
    return a.startedAtMs + Math.max(this.opts.hedgeMinMs, a.predictedTtftMs * Math.max(1.5, q), alt)
  }

  /** A snapshot per node for /metrics. */
  snapshot(nowMs: number): {
    node: string
    tokensPerSec: number
    /** What its prediction is multiplied by for a slowdown seen in short first tokens (1: none). */
    slowness: number
    queuedTokens: number
    decoding: number
    itlMs: number
    rttMs: number
    hitRatio: number
    indexBlocks: number
    /** Percentiles of the recent first-token times (NaN before any). */
    ttftP50Ms: number
    ttftP90Ms: number
    ttftP99Ms: number
    ttftSamples: number
  }[] {
    return [...this.models.values()].map((m) => ({
      node: m.node.name,
      tokensPerSec: m.rate(nowMs),
      slowness: m.slowness(nowMs),
      queuedTokens: m.queuedTokens,
      decoding: m.decoding,
      itlMs: m.itlMs,
      rttMs: m.rttMs,
      hitRatio: m.hitRatio,
      indexBlocks: m.index.size,
      ttftP50Ms: m.ttft.quantile(0.5),
      ttftP90Ms: m.ttft.quantile(0.9),
      ttftP99Ms: m.ttft.quantile(0.99),
      ttftSamples: m.ttft.count,
    }))
  }

  /**
   * What decoding neighbours add to a first token: on a node decoding D requests, a new prompt
   * waits for the step under way (half of one, on average) and its prefill runs in a step that
   * also decodes them: 1.5 steps of itl x (1 + gamma x D). An idle node starts it at once.
   */
  decodeStepsMs(decoding: number, itlMs: number): number {
    return decoding > 0 ? 1.5 * itlMs * (1 + this.opts.gamma * decoding) : 0
  }

  /**
   * The rate a request's end confirms (usage's cached tokens known). Lower than the node's, it
   * dips the node from now when the node is slow next to the fleet (a slowed node stays priced
   * down), else from the first token: a slowdown of every node at once was load, and is over.
   */
  private observeEndRate(m: NodeModel, sample: number, a: Attempt, nowMs: number): void {
    const fleet = this.fleetRatios.count >= 8 ? this.fleetRatios.quantile(0.5) : Number.POSITIVE_INFINITY
    const alone = sample / m.baseRate < this.opts.fleetSlowShare * fleet
    const first = !m.measured
    const firstMs = a.firstAtMs ?? nowMs
    m.observeRate(sample, nowMs, alone && nowMs - firstMs <= this.opts.staleSampleMs ? nowMs : firstMs)
    // Its twins not measured yet take its rate now (applyTwin), not at their next /metrics.
    if (first && m.measured && m.cacheBlocks !== undefined) {
      this.twinMeans.delete(m.cacheBlocks)
      for (const o of this.models.values())
        if (!o.measured && o.cacheBlocks === m.cacheBlocks) this.applyTwin(o, nowMs)
    }
  }

  /**
   * A first token that teaches no rate (short, or a wait mostly decode steps): how much later it
   * came than the node's speed alone predicted (past the round trip; the prediction without the
   * slowness it was made with and without a stall's silence pricing), up to `maxSlowness`, is the
   * node's slowness from now when that is at least `slowShare`, the token at least an inter-token
   * time late, and the factor at least `slowShare` times the fleet's recent median (a burst makes
   * every node late); a node priced slow whose first token is less late is priced by it.
   */
  private observeShort(m: NodeModel, a: Attempt, ttftMs: number, nowMs: number): void {
    const speedMs = a.predictedSpeedMs
    if (speedMs === undefined || !(speedMs > 0)) return
    // A first token comes no sooner than one engine step: the node's own, but no longer than the
    // step its model's nodes take (their lower median), since a slowed node's steps are slow too:
    // learnt from its first streams, its own would hide the slowdown it shows.
    const stepMs = Math.min(m.itlMs, this.modelItlMs(a.req.modelId, nowMs) ?? m.itlMs)
    const factor = Math.min(this.opts.maxSlowness, (ttftMs - m.rttMs) / Math.max(speedMs, stepMs))
    this.fleetSlowness.add(factor)
    const now = m.slowness(nowMs)
    if (factor >= this.opts.slowShare && factor > now) {
      if (this.fleetSlowness.count < 8) return
      if (
        ttftMs - m.rttMs - speedMs >= stepMs &&
        factor >= this.opts.slowShare * this.fleetSlowness.quantile(0.5)
      )
        m.observeSlowness(factor, nowMs)
    } else if (now > 1 && factor < now) m.observeSlowness(factor, nowMs)
  }

  /** Each model's nodes as last routed to (`choose`), for `modelItlMs`. */
  private readonly modelCandidates = new Map<string, readonly Candidate[]>()
  private readonly modelItls = new SecondCache<string, number | undefined>()

  /**
   * The lower median of the learnt inter-token times of a model's nodes (two at least, learnt
   * from their streams), computed at most once a second.
   */
  private modelItlMs(modelId: string, nowMs: number): number | undefined {
    return this.modelItls.get(modelId, nowMs, () => {
      const itls: number[] = []
      for (const c of this.modelCandidates.get(modelId) ?? []) {
        const o = this.models.get(c.node)
        if (o?.itlSampled) itls.push(o.itlMs)
      }
      itls.sort((x, y) => x - y)
      return itls.length >= 2 ? itls[(itls.length - 1) >> 1] : undefined
    })
  }

  private dequeue(m: NodeModel, a: Attempt): void {
    if (a.queuedTokens === 0) return
    m.queuedTokens = Math.max(0, m.queuedTokens - a.queuedTokens)
    m.waiting = Math.max(0, m.waiting - 1)
    a.queuedTokens = 0
  }
}
