/**
 * The routing benchmark's world in virtual time: a fleet of simulated inference engines (the
 * simulator's own continuous-batching model, src/simulator/engine.ts), a network delay per node,
 * and the real routing code (policy, node pool, passive health, hedge budget) driving it. No
 * timers and no wall clock: an event queue advances time, so a run is exact and repeatable.
 */
import { type ModelConfig, OPENAI_ROUTE } from '../../src/config/load.ts'
import { ShareBudget } from '../../src/routing/budget.ts'
import { type Candidate, NodePool } from '../../src/routing/nodes.ts'
import { Attempt, type NodeMetrics, type RouteRequest, type RoutingPolicy } from '../../src/routing/policy.ts'
import { chainSeed } from '../../src/routing/prefix.ts'
import { Engine, type EngineParams } from '../../src/simulator/engine.ts'
import { blockHashes, type TraceRequest } from './workloads.ts'

export interface NodeSpec {
  readonly name: string
  readonly kind: 'fast' | 'medium' | 'slow'
  readonly prefillTokensPerSec: number
  readonly itlMs: number
  readonly maxSeqs: number
  readonly cacheTokens: number
  readonly prefillBudgetTokens: number
  readonly rttMs: number
}

const spec = (
  name: string,
  kind: NodeSpec['kind'],
  prefillTokensPerSec: number,
  itlMs: number,
  maxSeqs: number,
  cacheTokens: number,
  prefillBudgetTokens: number,
  rttMs: number,
): NodeSpec => ({ name, kind, prefillTokensPerSec, itlMs, maxSeqs, cacheTokens, prefillBudgetTokens, rttMs })

/**
 * The mixed fleet of 8: 2 fast GPU nodes (prefill 20k tok/s, ITL 15 ms, large cache), 4 medium
 * (8k tok/s, 25 ms), 2 slow llama.cpp-like (2.5k tok/s, 40 ms, 4 sequences, small cache). Each
 * decoding sequence adds ITL/20 to an iteration (the engine's default), and one iteration
 * prefills at most the budget.
 */
const fast = (i: number, rtt: number) => spec(`fast-${i}`, 'fast', 20_000, 15, 64, 600_000, 8192, rtt)
const medium = (i: number, rtt: number) => spec(`medium-${i}`, 'medium', 8_000, 25, 32, 200_000, 4096, rtt)
const slow = (i: number, rtt: number) => spec(`slow-${i}`, 'slow', 2_500, 40, 4, 16_000, 512, rtt)

function mixed(copies: number): NodeSpec[] {
  const out: NodeSpec[] = []
  for (let k = 0; k < copies; k++) {
    const i = (j: number) => k * 10 + j
    out.push(fast(i(1), 1), fast(i(2), 2))
    for (let j = 1; j <= 4; j++) out.push(medium(i(j), j))
    out.push(slow(i(1), 5), slow(i(2), 5))
  }
  return out
}

/** Identical nodes: the medium kind (8k tok/s, 25 ms, 32 sequences, 200k-token cache), RTT 1-4 ms. */
const identical = (n: number) => Array.from({ length: n }, (_, i) => medium(i + 1, 1 + (i % 4)))

export const FLEETS = {
  'identical-8': identical(8),
  'identical-16': identical(16),
  'identical-32': identical(32),
  'mixed-8': mixed(1),
  'mixed-32': mixed(4),
} satisfies Record<string, readonly NodeSpec[]>
export type FleetName = keyof typeof FLEETS
export const FLEET: readonly NodeSpec[] = FLEETS['mixed-8']

/**
 * Nominal capacity of a node in requests/s: every slot busy, each request costing its share of
 * the decode iterations (out x (itl + itl/20 x slots) / slots) plus its uncached prefill.
 */
export function nodeCapacity(n: NodeSpec, uncachedTokens: number, outputTokens: number): number {
  const perRequestMs =
    (outputTokens * (n.itlMs + (n.itlMs / 20) * n.maxSeqs)) / n.maxSeqs +
    (uncachedTokens * 1000) / n.prefillTokensPerSec
  return 1000 / perRequestMs
}

export function fleetCapacity(fleet: readonly NodeSpec[], uncached: number, out: number): number {
  return fleet.reduce((s, n) => s + nodeCapacity(n, uncached, out), 0)
}

export interface SimOptions {
  readonly fleet: readonly NodeSpec[]
  /**
   * Feed each node's /metrics (waiting, running, KV-cache use as vLLM reports it, cache blocks)
   * to the policy every this many ms; undefined: never.
   */
  readonly metricsEveryMs: number | undefined
  /** Hedge late first tokens (within 5% of requests), if the policy proposes times. */
  readonly hedge: boolean
  /** Slow a node down: [node index, from ms, to ms, factor]. */
  readonly slowdowns: readonly (readonly [number, number, number, number])[]
  /**
   * Stall a node without errors: [node index, from ms, to ms]. It accepts requests and answers
   * nothing (no tokens, no progress, its /metrics frozen as vLLM's are when the engine hangs)
   * until `to`, then carries on where it stopped.
   */
  readonly stalls: readonly (readonly [number, number, number])[]
  /**
   * Deadline-aware admission: every request carries this TTFT budget (ms), and a request no
   * node is predicted to answer within it is refused at once (a 429 with retry-after in the
   * pipeline), as `x-tropa-ttft-budget-ms` does. Undefined: off.
   */
  readonly ttftBudgetMs?: number | undefined
  /** Requests arriving before this are not measured (warm-up). */
  readonly measureFromMs: number
  readonly measureToMs: number
  /** Stop the world here even if requests are still open (they count as not served). */
  readonly horizonMs: number
}

export interface SimResult {
  /** TTFT (ms) of each measured request that got a first token by the horizon. */
  readonly ttftMs: number[]
  /** Measured requests without a first token by the horizon. */
  readonly unserved: number
  readonly measured: number
  readonly hedges: number
  /** Prompt tokens served from the nodes' caches, share of all prompt tokens. */
  readonly cacheHitShare: number
  /** Requests sent to a stalled node more than 2 s into its stall (first attempts and hedges). */
  readonly sentToStalledAfter2s: number
  /** Measured requests refused by deadline-aware admission (not in `unserved`). */
  readonly refused: number
  /** Warm-ups the policy asked for (`takeWarmup`): a node sent a request's prompt for one token. */
  readonly warmups: number
}

/** Prompt block hashes of a trace, computed once and shared by every policy's run. */
export interface PreparedRequest extends TraceRequest {
  /** 16-token block hashes: the engine's cache keys, and the fine index of the peers that keep one. */
  readonly fineBlocks: readonly number[]
  readonly engineBlocks: readonly string[]
  /** 64-token blocks (256 characters): Tropa's and SGLang's index (prefix.ts). */
  readonly routerBlocks: readonly number[]
  /** Closed loop: the session's next turn, sent `thinkMs` after this one's last token. */
  readonly next: PreparedRequest | undefined
}

const MODEL = 'bench/chat'

export function prepare(trace: readonly TraceRequest[]): PreparedRequest[] {
  const seed = chainSeed(MODEL)
  const one = (r: TraceRequest): PreparedRequest => {
    const fineBlocks = blockHashes(r.segments, 16, 0x811c9dc5)
    return {
      ...r,
      fineBlocks,
      // The engine keys its cache by block id; numbers hash faster than their strings.
      engineBlocks: fineBlocks as unknown as readonly string[],
      routerBlocks: blockHashes(r.segments, 64, seed),
      next: r.next ? one(r.next) : undefined,
    }
  }
  return trace.map(one)
}

class Heap {
  private readonly a: { t: number; seq: number; fn: () => void }[] = []
  private seq = 0
  get size() {
    return this.a.length
  }
  push(t: number, fn: () => void) {
    const a = this.a
    a.push({ t, seq: this.seq++, fn })
    let i = a.length - 1
    while (i > 0) {
      const p = (i - 1) >> 1
      if (this.less(a[p]!, a[i]!)) break
      ;[a[p], a[i]] = [a[i]!, a[p]!]
      i = p
    }
  }
  pop() {
    const a = this.a
    const top = a[0]!
    const last = a.pop()!
    if (a.length > 0) {
      a[0] = last
      let i = 0
      for (;;) {
        const l = 2 * i + 1
        const r = l + 1
        let m = i
        if (l < a.length && this.less(a[l]!, a[m]!)) m = l
        if (r < a.length && this.less(a[r]!, a[m]!)) m = r
        if (m === i) break
        ;[a[m], a[i]] = [a[i]!, a[m]!]
        i = m
      }
    }
    return top
  }
  private less(x: { t: number; seq: number }, y: { t: number; seq: number }) {
    return x.t < y.t || (x.t === y.t && x.seq < y.seq)
  }
}

interface SimNode {
  readonly spec: NodeSpec
  readonly engine: Engine
  /** The engine tick that is scheduled (older scheduled ticks are stale). */
  tickAt: number | undefined
  /** Engine time = virtual time - offset (a stall shifts the engine's clock by its length). */
  offset: number
  /** While stalled: since when, the engine calls held until the end, and the frozen /metrics. */
  stalledAt: number | undefined
  held: ((engineNow: number) => void)[]
  frozen: BenchMetrics | undefined
}

/** What a node's /metrics says: vLLM's gauges and its cache size (`vllm:cache_config_info`). */
export interface BenchMetrics extends NodeMetrics {
  readonly cacheBlocks: number
}

interface Job {
  readonly req: PreparedRequest
  readonly arrivalMs: number
  readonly attempts: Set<Attempt>
  firstAtMs: number | undefined
  hedged: boolean
  refused?: boolean
}

/** Runs one policy over one prepared trace; returns what the clients saw. */
export function simulate(policy: RoutingPolicy, trace: readonly PreparedRequest[], o: SimOptions): SimResult {
  const model: ModelConfig = {
    id: MODEL,
    ownedBy: 'bench',
    kind: 'chat',
    contextLength: 1_000_000,
    dimensions: undefined,
    created: 0,
    price: { promptNano: 0n, completionNano: 0n, cachedPromptNano: 0n },
    fallbacks: [],
    routes: o.fleet.map((n) => ({
      ...OPENAI_ROUTE,
      node: n.name,
      baseUrl: `http://${n.name}`,
      upstreamModel: 'm',
      apiKey: undefined,
      maxConcurrency: 1024,
      weight: 1,
      firstByteTimeoutMs: undefined,
      hedge: true,
      priorityScheduling: false,
      warmSessions: undefined,
      metricsUrl: '',
    })),
  }
  const pool = new NodePool([model])
  const cands = pool.candidates(MODEL)
  const nodes = new Map<Candidate, SimNode>()
  o.fleet.forEach((n, i) => {
    const params: EngineParams = {
      prefillTokensPerSec: n.prefillTokensPerSec,
      itlMs: n.itlMs,
      iterationOverheadMs: 1,
      maxSeqs: n.maxSeqs,
      prefillBudgetTokens: n.prefillBudgetTokens,
      cacheBlocks: Math.floor(n.cacheTokens / 16),
      tokenEvents: false,
    }
    nodes.set(cands[i]!, {
      spec: n,
      engine: new Engine(params),
      tickAt: undefined,
      offset: 0,
      stalledAt: undefined,
      held: [],
      frozen: undefined,
    })
  })
  const heap = new Heap()
  let now = 0
  const at = (t: number, fn: () => void) => heap.push(Math.max(t, now), fn)
  const hedges = new ShareBudget(0.05, 10)
  const jobOf = new Map<string, { job: Job; a: Attempt; node: SimNode }>()
  const idOf = new Map<Attempt, string>()
  const cachedOf = new Map<Attempt, number>()
  const waitingJobs: Job[] = []
  /** Warm-ups the policy asked for (`takeWarmup`), by engine id. */
  const warmOf = new Map<string, Attempt>()
  const warmCached = new Map<string, number>()
  let warmups = 0
  const ttft: number[] = []
  let measured = 0
  let served = 0
  let nextId = 0
  let cachedTokens = 0
  let promptTokens = 0
  let sentToStalledAfter2s = 0
  let refused = 0
  /** Runs an engine call now, or at the end of the node's stall. */
  const onEngine = (n: SimNode, fn: (engineNow: number) => void) => {
    if (n.stalledAt !== undefined) n.held.push(fn)
    else {
      fn(now - n.offset)
      scheduleTick(n)
    }
  }

  const scheduleTick = (n: SimNode) => {
    if (n.stalledAt !== undefined) return
    const engineNext = n.engine.nextEventAt()
    if (engineNext === undefined) return
    const next = engineNext + n.offset
    if (next === n.tickAt) return
    n.tickAt = next
    at(next, () => {
      if (n.tickAt !== next) return
      n.tickAt = undefined
      if (n.stalledAt !== undefined) return // resumes at the stall's end
      // The engine's own time, not now - offset: float rounding could stop short of it.
      for (const ev of n.engine.advance(engineNext)) {
        const entry = jobOf.get(ev.id)
        if (!entry) {
          const w = warmOf.get(ev.id)
          if (!w) continue
          const back = ev.at + n.offset + n.spec.rttMs / 2
          // Streamed, as the router sends it: its first token teaches the node's prefill rate.
          if (ev.kind === 'first_token') {
            const cached = ev.cachedTokens
            at(back, () => {
              warmCached.set(ev.id, cached)
              policy.firstChunk(w, now)
            })
          } else if (ev.kind === 'done')
            at(back, () => {
              warmOf.delete(ev.id)
              pool.end(w.candidate.node, true, now)
              policy.ended(w, now, 'ok', warmCached.get(ev.id), 1)
              warmCached.delete(ev.id)
            })
          continue
        }
        const back = ev.at + n.offset + n.spec.rttMs / 2
        if (ev.kind === 'first_token') at(back, () => onFirst(ev.id, ev.cachedTokens))
        else if (ev.kind === 'done') at(back, () => onDone(ev.id))
      }
      scheduleTick(n)
    })
  }

  const dispatch = (job: Job, exclude: Set<Candidate>): boolean => {
    const r = job.req
    const req: RouteRequest & { fine: readonly number[] } = {
      modelId: MODEL,
      promptTokens: r.promptTokens,
      fine: r.fineBlocks,
      prefix: r.routerBlocks,
      blockTokens: 64,
      session: r.session,
      stream: true,
      exclude,
      // As the router (pipeline/dispatch.ts): first attempts only, under the warm-up cap.
      canExplore: exclude.size === 0 && warmOf.size < 32,
      ttftBudgetMs: o.ttftBudgetMs,
      nowMs: now,
    }
    const c = policy.choose(cands, req)
    if (!c) return false
    if (o.ttftBudgetMs !== undefined && exclude.size === 0 && policy.estimateTtftMs) {
      const predicted = policy.estimateTtftMs(c, req)
      if (predicted !== undefined && predicted > o.ttftBudgetMs) {
        job.refused = true
        if (job.arrivalMs >= o.measureFromMs && job.arrivalMs < o.measureToMs) refused++
        // A closed loop goes on: its next turn follows a think time after the refusal.
        const next = job.req.next
        if (next) arrive(next, now + next.thinkMs)
        return true
      }
    }
    const n = nodes.get(c)!
    if (n.stalledAt !== undefined && now - n.stalledAt > 2000) sentToStalledAfter2s++
    pool.begin(c.node, now)
    const a = new Attempt(c, req, now)
    policy.started(a)
    const warm = policy.takeWarmup?.()?.candidate
    // As the router does (pipeline/dispatch.ts warmUp): at most 32 at once, else declined.
    if (warm && warmOf.size >= 32) policy.declineWarmup?.(a)
    else if (warm) {
      const wn = nodes.get(warm)!
      const wreq = { ...req, session: undefined }
      pool.begin(warm.node, now)
      const wa = new Attempt(warm, wreq, now)
      wa.warmup = true
      policy.started(wa)
      const wid = `w${nextId++}`
      warmOf.set(wid, wa)
      warmups++
      at(now + wn.spec.rttMs / 2, () =>
        onEngine(wn, (t) =>
          wn.engine.submit(
            { id: wid, promptBlocks: r.engineBlocks, promptTokens: r.promptTokens, outputTokens: 1 },
            t,
          ),
        ),
      )
    }
    const id = `a${nextId++}`
    jobOf.set(id, { job, a, node: n })
    job.attempts.add(a)
    idOf.set(a, id)
    at(now + n.spec.rttMs / 2, () => {
      if (!jobOf.has(id)) return // cancelled on the way
      onEngine(n, (t) =>
        n.engine.submit(
          { id, promptBlocks: r.engineBlocks, promptTokens: r.promptTokens, outputTokens: r.outputTokens },
          t,
        ),
      )
    })
    if (o.hedge && !job.hedged && policy.hedgeAtMs) {
      const t = policy.hedgeAtMs(a)
      if (t !== undefined)
        at(t, () => {
          if (job.firstAtMs !== undefined || job.hedged || job.attempts.size === 0) return
          if (!hedges.take()) return
          job.hedged = true
          dispatch(job, new Set([...exclude, c]))
        })
    }
    return true
  }

  const cancel = (id: string) => {
    const e = jobOf.get(id)
    if (!e) return
    jobOf.delete(id)
    e.job.attempts.delete(e.a)
    idOf.delete(e.a)
    pool.cancel(e.a.candidate.node)
    policy.ended(e.a, now, 'cancelled', undefined)
    at(now + e.node.spec.rttMs / 2, () => onEngine(e.node, (t) => e.node.engine.cancel(id, t)))
  }

  const onFirst = (id: string, cached: number) => {
    const e = jobOf.get(id)
    if (!e) return
    const { job, a } = e
    if (job.firstAtMs !== undefined) return
    job.firstAtMs = now
    policy.firstChunk(a, now)
    cachedOf.set(a, cached)
    cachedTokens += cached
    promptTokens += job.req.promptTokens
    if (job.arrivalMs >= o.measureFromMs && job.arrivalMs < o.measureToMs) {
      ttft.push(now - job.arrivalMs)
      served++
    }
    for (const other of [...job.attempts]) if (other !== a) cancel(idOf.get(other)!)
  }

  const onDone = (id: string) => {
    const e = jobOf.get(id)
    if (!e) return
    jobOf.delete(id)
    e.job.attempts.delete(e.a)
    pool.end(e.a.candidate.node, true, now)
    policy.ended(e.a, now, 'ok', cachedOf.get(e.a), e.job.req.outputTokens)
    idOf.delete(e.a)
    cachedOf.delete(e.a)
    const next = e.job.req.next
    if (next && e.job.attempts.size === 0) arrive(next, now + next.thinkMs)
    drain()
  }

  const drain = () => {
    while (waitingJobs.length > 0) {
      if (!dispatch(waitingJobs[0]!, new Set())) return
      waitingJobs.shift()
    }
  }

  /** A request arrives (a closed loop's next turn only while the run lasts). */
  function arrive(r: PreparedRequest, t: number) {
    if (t >= o.measureToMs) return // a closed loop's turn after the end
    if (t >= o.measureFromMs && t < o.measureToMs) measured++
    at(t, () => {
      hedges.earn() // as the pipeline does for every request (pipeline/dispatch.ts)
      const job: Job = { req: r, arrivalMs: t, attempts: new Set(), firstAtMs: undefined, hedged: false }
      if (waitingJobs.length > 0 || !dispatch(job, new Set())) waitingJobs.push(job)
    })
  }
  for (const r of trace) arrive(r, r.arrivalMs)
  for (const [i, from, to, factor] of o.slowdowns) {
    const n = nodes.get(cands[i]!)!
    at(from, () => onEngine(n, () => n.engine.setSlowdown(factor)))
    at(to, () => onEngine(n, () => n.engine.setSlowdown(1)))
  }
  const metricsOf = (n: SimNode): BenchMetrics =>
    n.frozen ?? {
      waiting: n.engine.waiting(),
      running: n.engine.running(),
      kvUsage: n.engine.kvUsage(),
      cacheBlocks: Math.floor(n.spec.cacheTokens / 16),
    }
  for (const [i, from, to] of o.stalls) {
    const n = nodes.get(cands[i]!)!
    at(from, () => {
      n.frozen = metricsOf(n)
      n.stalledAt = now
      n.tickAt = undefined
    })
    at(to, () => {
      n.offset += now - n.stalledAt!
      n.stalledAt = undefined
      n.frozen = undefined
      for (const fn of n.held.splice(0)) fn(now - n.offset)
      scheduleTick(n)
    })
  }
  const every = o.metricsEveryMs
  if (every !== undefined && policy.nodeMetrics) {
    const poll = () => {
      for (const [c, n] of nodes) policy.nodeMetrics!(c.node, metricsOf(n), now)
      if (now + every < o.horizonMs) at(now + every, poll)
    }
    at(every, poll)
  }

  while (heap.size > 0) {
    const ev = heap.pop()
    if (ev.t > o.horizonMs) break
    now = ev.t
    ev.fn()
  }
  return {
    ttftMs: ttft,
    unserved: measured - served - refused,
    measured,
    hedges: hedges.used,
    cacheHitShare: promptTokens === 0 ? 0 : cachedTokens / promptTokens,
    sentToStalledAfter2s,
    refused,
    warmups,
  }
}
