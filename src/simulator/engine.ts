/**
 * A continuous-batching inference engine as a pure timing model: no timers, no I/O, no clock.
 * The caller passes times in (ms), so the same class runs under real timers in the HTTP
 * simulator and in virtual time in the routing benchmark.
 *
 * Each iteration takes `iterationOverheadMs + prefillTokens * 1000 / prefillTokensPerSec +
 * (decoding ? itlMs + decodeMsPerSeq * decodingSeqs : 0)`, times the slowdown: the `a + b*prefill
 * + c*decode_seqs` of a GPU engine, where one decode step costs about the same for one sequence
 * or a few, and grows slowly with the batch. Prefill is chunked under a per-iteration token
 * budget; every decoding sequence yields one token per iteration; a sequence's first token
 * comes at the end of the iteration that finishes its prefill. A block-level LRU prefix cache
 * means only uncached prompt tokens are prefilled.
 */
export interface EngineParams {
  prefillTokensPerSec: number
  itlMs: number
  iterationOverheadMs: number
  maxSeqs: number
  prefillBudgetTokens: number
  cacheBlocks: number
  blockSize?: number
  /** Extra decode time per running sequence; default itlMs / 20. */
  decodeMsPerSeq?: number
  /** Emit an event per generated token (default true; the routing benchmark needs only first and done). */
  tokenEvents?: boolean
  /**
   * vLLM's `--scheduling-policy priority`: waiting requests are admitted lowest `priority` first
   * (then first come), and prefill goes to them in that order. (vLLM also pre-empts running
   * sequences of a lower priority; this model does not.)
   */
  priorityScheduling?: boolean
}

export interface EngineRequest {
  id: string
  /** Chained block hashes, one per full block of the prompt. */
  promptBlocks: readonly string[]
  promptTokens: number
  outputTokens: number
  /** Lower runs first (vLLM's request `priority`); 0 when absent. */
  priority?: number
}

export type EngineEvent =
  | { kind: 'first_token'; id: string; at: number; cachedTokens: number }
  | { kind: 'token'; id: string; at: number; index: number }
  | { kind: 'done'; id: string; at: number }

interface Seq {
  req: EngineRequest
  cachedTokens: number
  prefillLeft: number
  generated: number
  cancelled: boolean
  /** Admitted to the running batch: its prompt blocks are held in the KV cache. */
  held: boolean
}

interface Plan {
  endsAt: number
  prefill: [Seq, number][]
  decode: Seq[]
}

export class Engine {
  private readonly waitingQ: Seq[] = []
  private readonly runningSeqs: Seq[] = []
  private readonly byId = new Map<string, Seq>()
  /** Block hash -> present; Map order is recency (oldest first). */
  private readonly cache = new Map<string, true>()
  /** Prompt blocks held by running sequences, with how many sequences hold each. */
  private readonly heldBlocks = new Map<string, number>()
  private plan: Plan | undefined
  private slowdown = 1
  /** Tokens per prefix-cache block (vLLM's block_size). */
  readonly blockSize: number

  constructor(private readonly p: EngineParams) {
    this.blockSize = p.blockSize ?? 16
  }

  submit(req: EngineRequest, now: number): void {
    const seq: Seq = {
      req,
      cachedTokens: 0,
      prefillLeft: req.promptTokens,
      generated: 0,
      cancelled: false,
      held: false,
    }
    this.byId.set(req.id, seq)
    this.waitingQ.push(seq)
    if (!this.plan) this.schedule(now)
  }

  cancel(id: string, now: number): void {
    const seq = this.byId.get(id)
    if (!seq) return
    seq.cancelled = true
    this.byId.delete(id)
    const w = this.waitingQ.indexOf(seq)
    if (w >= 0) this.waitingQ.splice(w, 1)
    const r = this.runningSeqs.indexOf(seq)
    if (r >= 0) this.runningSeqs.splice(r, 1)
    this.release(seq)
    if (!this.plan) this.schedule(now)
  }

  nextEventAt(): number | undefined {
    return this.plan?.endsAt
  }

  /** Runs every iteration that ends at or before `to`, returning what happened, in order. */
  advance(to: number): EngineEvent[] {
    const events: EngineEvent[] = []
    while (this.plan && this.plan.endsAt <= to) {
      const { endsAt, prefill, decode } = this.plan
      this.plan = undefined
      for (const seq of decode) {
        if (seq.cancelled) continue
        if (this.p.tokenEvents !== false)
          events.push({ kind: 'token', id: seq.req.id, at: endsAt, index: seq.generated })
        seq.generated++
        if (seq.generated >= seq.req.outputTokens) this.finish(seq, endsAt, events)
      }
      for (const [seq, n] of prefill) {
        if (seq.cancelled) continue
        seq.prefillLeft -= n
        if (seq.prefillLeft > 0) continue
        this.insertBlocks(seq.req.promptBlocks)
        events.push({ kind: 'first_token', id: seq.req.id, at: endsAt, cachedTokens: seq.cachedTokens })
        seq.generated = 1
        if (seq.generated >= seq.req.outputTokens) this.finish(seq, endsAt, events)
      }
      this.schedule(endsAt)
    }
    return events
  }

  running(): number {
    return this.runningSeqs.length
  }

  waiting(): number {
    return this.waitingQ.length
  }

  /** Share of the prefix cache's blocks in use (cached prefixes included: near 1 on a warm node). */
  cacheUsage(): number {
    return this.p.cacheBlocks === 0 ? 0 : this.cache.size / this.p.cacheBlocks
  }

  /**
   * KV-cache use as vLLM reports it (`vllm:kv_cache_usage_perc`): blocks held by running
   * sequences (prompt blocks shared between them counted once, plus each one's partial and
   * generated tokens) over the capacity. Cached prefixes no sequence holds are free blocks.
   */
  kvUsage(): number {
    if (this.p.cacheBlocks === 0) return 0
    let blocks = this.heldBlocks.size
    for (const seq of this.runningSeqs)
      blocks += Math.ceil(((seq.req.promptTokens % this.blockSize) + seq.generated) / this.blockSize)
    return Math.min(1, blocks / this.p.cacheBlocks)
  }

  setSlowdown(factor: number): void {
    this.slowdown = factor
  }

  /** Tokens of the prompt's longest cached prefix, refreshing those blocks' recency. */
  lookupPrefix(blocks: readonly string[], promptTokens: number): number {
    let hit = 0
    for (const b of blocks) {
      if (!this.cache.has(b)) break
      this.cache.delete(b)
      this.cache.set(b, true)
      hit++
    }
    // At least one token is always computed, as real engines recompute the last one.
    return Math.min(hit * this.blockSize, Math.max(0, promptTokens - 1))
  }

  insertBlocks(blocks: readonly string[]): void {
    for (const b of blocks) {
      this.cache.delete(b)
      this.cache.set(b, true)
    }
    while (this.cache.size > this.p.cacheBlocks) {
      const oldest = this.cache.keys().next().value as string
      this.cache.delete(oldest)
    }
  }

  private finish(seq: Seq, at: number, events: EngineEvent[]) {
    events.push({ kind: 'done', id: seq.req.id, at })
    this.byId.delete(seq.req.id)
    const r = this.runningSeqs.indexOf(seq)
    if (r >= 0) this.runningSeqs.splice(r, 1)
    this.release(seq)
  }

  private release(seq: Seq) {
    if (!seq.held) return
    seq.held = false
    for (const b of seq.req.promptBlocks) {
      const n = this.heldBlocks.get(b)!
      if (n <= 1) this.heldBlocks.delete(b)
      else this.heldBlocks.set(b, n - 1)
    }
  }

  /** The waiting sequence of the lowest priority value, the earliest among equals. */
  private takeFirstByPriority(): Seq {
    let best = 0
    for (let i = 1; i < this.waitingQ.length; i++)
      if ((this.waitingQ[i]!.req.priority ?? 0) < (this.waitingQ[best]!.req.priority ?? 0)) best = i
    return this.waitingQ.splice(best, 1)[0]!
  }

  /** Admits waiting sequences FCFS (or by priority) and plans the next iteration starting at `now`. */
  private schedule(now: number) {
    while (this.waitingQ.length > 0 && this.runningSeqs.length < this.p.maxSeqs) {
      const seq = this.p.priorityScheduling ? this.takeFirstByPriority() : this.waitingQ.shift()!
      seq.cachedTokens = this.lookupPrefix(seq.req.promptBlocks, seq.req.promptTokens)
      seq.prefillLeft = seq.req.promptTokens - seq.cachedTokens
      seq.held = true
      for (const b of seq.req.promptBlocks) this.heldBlocks.set(b, (this.heldBlocks.get(b) ?? 0) + 1)
      this.runningSeqs.push(seq)
    }
    if (this.runningSeqs.length === 0) return
    let budget = this.p.prefillBudgetTokens
    const prefill: [Seq, number][] = []
    const decode: Seq[] = []
    let prefillTokens = 0
    const order = this.p.priorityScheduling
      ? [...this.runningSeqs].sort((a, b) => (a.req.priority ?? 0) - (b.req.priority ?? 0))
      : this.runningSeqs
    for (const seq of order) {
      if (seq.prefillLeft > 0) {
        if (budget <= 0) continue
        const n = Math.min(seq.prefillLeft, budget)
        budget -= n
        prefillTokens += n
        prefill.push([seq, n])
      } else decode.push(seq)
    }
    const ms =
      (this.p.iterationOverheadMs +
        (prefillTokens * 1000) / this.p.prefillTokensPerSec +
        (decode.length > 0
          ? this.p.itlMs + (this.p.decodeMsPerSeq ?? this.p.itlMs / 20) * decode.length
          : 0)) *
      this.slowdown
    this.plan = { endsAt: now + ms, prefill, decode }
  }
}

/** Chained hashes of the prompt's full blocks, seeded by model: equal prefixes give equal chains. */
export function promptBlockHashes(modelSeed: string, tokens: readonly number[], blockSize = 16): string[] {
  const out: string[] = []
  let h = fnv1a(modelSeed)
  for (let start = 0; start + blockSize <= tokens.length; start += blockSize) {
    for (let i = start; i < start + blockSize; i++) h = Math.imul(h ^ tokens[i]!, 0x01000193) >>> 0
    h = Math.imul(h ^ 0x9e3779b9, 0x85ebca6b) >>> 0
    out.push(`${h.toString(36)}.${start / blockSize}`)
  }
  return out
}

export function fnv1a(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0
  return h
}
