/**
 * Request traces for the virtual-time routing benchmark. A prompt is a list of segments (an id and
 * a length in tokens); token i of segment s is a function of (s, i) only, so two prompts share a
 * prefix exactly where they share leading segments. Traces depend on the seed alone, so every
 * policy sees the same requests at the same times.
 */

export interface Segment {
  readonly id: number
  readonly tokens: number
}

export interface TraceRequest {
  readonly id: number
  readonly arrivalMs: number
  readonly segments: readonly Segment[]
  readonly promptTokens: number
  readonly outputTokens: number
  readonly session: string | undefined
  /** Closed loop: the next turn of this session, sent `next.thinkMs` after this one ends. */
  readonly next?: TraceRequest
  /** Think time before this turn (closed-loop turns after the first); 0 otherwise. */
  readonly thinkMs: number
}

export const WORKLOAD_NAMES = [
  'W1',
  'W2',
  'W3',
  'W4',
  'zipf',
  'agentic',
  'burst',
  'stall',
  'slow',
  'slow-zipf',
] as const
export type WorkloadName = (typeof WORKLOAD_NAMES)[number]

export const WORKLOADS: Record<WorkloadName, string> = {
  W1: 'shared prefix: 64 groups x 6k-token prefix, 1k unique suffix, 200 out',
  W2: 'multi-turn chat: 8 turns per user, 1k shared system prompt, history grows, think ~10 s',
  W3: 'no reuse (control): unique 2k prompts, 200 out',
  W4: 'bursts (10 s at 1.6x, 10 s at 0.4x) of W1 prompts; node 0 5x slower from 25% to 50% of the run',
  zipf: '300 system prompts of 1-8k tokens, Zipf(1) popularity, 200-token unique suffix',
  agentic:
    'closed-loop agent sessions: 8 agents (2k-token tool prompt), 10 turns, each = whole context + 400 new tokens, think 1 s + exp(2 s)',
  burst: 'unique 2k prompts in on/off bursts: 10 s at 1.96x, 20 s at 0.52x the mean rate',
  stall: 'W1 prompts; node 0 stalls without errors (no tokens, frozen /metrics) for 30 s from 40% of the run',
  slow: 'W1 prompts; node 0 4x slower from 30% to 70% of the run',
  'slow-zipf': 'zipf prompts (200 uncached tokens each); node 0 4x slower from 30% to 70% of the run',
}

const ZIPF_PROMPTS = 300
const AGENT_TURNS = 10

/**
 * Mean prompt tokens per request: the fleet's nominal capacity is computed without any cache
 * reuse, so a policy that keeps prefixes cached can serve more than 100% of it.
 */
export const PROMPT_TOKENS_PER_REQUEST: Record<WorkloadName, number> = {
  W1: 7000,
  W2: 2150,
  W3: 2000,
  W4: 7000,
  zipf: 4700, // 1-8k uniform per prompt, independent of rank: 4.5k + 200
  agentic: 2000 + 400 + 4.5 * 600, // turn k (0-9) carries k previous turns of 400 in + 200 out
  burst: 2000,
  stall: 7000,
  slow: 7000,
  'slow-zipf': 4700,
}
export const OUTPUT_TOKENS = 200

/** mulberry32: a small, fast, seeded generator (uniform [0, 1)). */
export function seeded(seed: number): () => number {
  let s = seed >>> 0
  return () => {
    s = (s + 0x6d2b79f5) >>> 0
    let t = s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

const exp = (rng: () => number, mean: number) => -Math.log(1 - rng()) * mean

/** Requests arriving over `durationMs` at `ratePerSec` on average. */
export function trace(
  name: WorkloadName,
  ratePerSec: number,
  durationMs: number,
  seed: number,
): TraceRequest[] {
  const rng = seeded(seed * 7919 + name.charCodeAt(1))
  const out: TraceRequest[] = []
  let uniqueSeg = 1_000_000
  let nextId = 0
  const make = (arrivalMs: number, segments: Segment[], session?: string, thinkMs = 0): TraceRequest => ({
    id: nextId++,
    arrivalMs,
    segments,
    promptTokens: segments.reduce((s, g) => s + g.tokens, 0),
    outputTokens: OUTPUT_TOKENS,
    session,
    thinkMs,
  })
  const add = (arrivalMs: number, segments: Segment[], session?: string) =>
    out.push(make(arrivalMs, segments, session))
  const sharedPrefix = () => [
    { id: 1000 + Math.floor(rng() * 64), tokens: 6000 },
    { id: uniqueSeg++, tokens: 1000 },
  ]
  const poisson = (next: () => Segment[]) => {
    for (let t = exp(rng, 1000 / ratePerSec); t < durationMs; t += exp(rng, 1000 / ratePerSec)) add(t, next())
  }
  if (name === 'W1' || name === 'stall' || name === 'slow') poisson(sharedPrefix)
  else if (name === 'W3') poisson(() => [{ id: uniqueSeg++, tokens: 2000 }])
  else if (name === 'zipf' || name === 'slow-zipf') {
    // Prompt lengths are drawn once per system prompt (seeded apart from the arrivals).
    const lenRng = seeded(seed * 31 + 7)
    const lengths = Array.from({ length: ZIPF_PROMPTS }, () => 1000 + Math.floor(lenRng() * 7001))
    const cdf: number[] = []
    let sum = 0
    for (let k = 1; k <= ZIPF_PROMPTS; k++) {
      sum += 1 / k
      cdf.push(sum)
    }
    poisson(() => {
      const u = rng() * sum
      let k = 0
      while (cdf[k]! < u) k++
      return [
        { id: 2000 + k, tokens: lengths[k]! },
        { id: uniqueSeg++, tokens: 200 },
      ]
    })
  } else if (name === 'burst') {
    // 10 s on at 1.957x the mean rate, 20 s off at 0.522x (150% and 40% at a mean of 77%).
    let t = 0
    while (t < durationMs) {
      const on = t % 30_000 < 10_000
      t += exp(rng, 1000 / (ratePerSec * (on ? 1.957 : 0.522)))
      if (t < durationMs) add(t, [{ id: uniqueSeg++, tokens: 2000 }])
    }
  } else if (name === 'agentic') {
    // Sessions start as a Poisson process at rate/turns; each turn's prompt is the whole
    // context so far (tool prompt, then each turn's 400 new tokens and 200-token answer) plus
    // its new tokens; the next turn is sent a think time after the answer ends (closed loop).
    let session = 0
    for (
      let t = exp(rng, (1000 * AGENT_TURNS) / ratePerSec);
      t < durationMs;
      t += exp(rng, (1000 * AGENT_TURNS) / ratePerSec)
    ) {
      const s = session++
      const context: Segment[] = [{ id: 3000 + Math.floor(rng() * 8), tokens: 2000 }]
      const turns: TraceRequest[] = []
      for (let k = 0; k < AGENT_TURNS; k++) {
        context.push({ id: 20_000_000 + s * 64 + k * 2, tokens: 400 })
        turns.push(make(t, [...context], `agent-${s}`, k === 0 ? 0 : 1000 + exp(rng, 2000)))
        context.push({ id: 20_000_001 + s * 64 + k * 2, tokens: OUTPUT_TOKENS })
      }
      for (let k = AGENT_TURNS - 2; k >= 0; k--) (turns[k] as { next?: TraceRequest }).next = turns[k + 1]
      out.push(turns[0]!)
    }
  } else if (name === 'W4') {
    // On/off bursts with the same mean rate: 10 s at 1.6x, 10 s at 0.4x.
    let t = 0
    while (t < durationMs) {
      const on = Math.floor(t / 10_000) % 2 === 0
      t += exp(rng, 1000 / (ratePerSec * (on ? 1.6 : 0.4)))
      if (t < durationMs) add(t, sharedPrefix())
    }
  } else {
    // Users start at random (8 turns each, so users arrive at rate/8); a turn comes 5 s (about
    // the answer's time) plus an exponential think time of mean 10 s after the previous one.
    const turns: { t: number; user: number; turn: number }[] = []
    let user = 0
    for (let t = exp(rng, 8000 / ratePerSec); t < durationMs; t += exp(rng, 8000 / ratePerSec)) {
      let at = t
      for (let k = 0; k < 8 && at < durationMs; k++) {
        turns.push({ t: at, user, turn: k })
        at += 5000 + exp(rng, 10_000)
      }
      user++
    }
    turns.sort((a, b) => a.t - b.t)
    for (const { t, user: u, turn } of turns) {
      const segments: Segment[] = [{ id: 1, tokens: 1000 }]
      for (let j = 0; j < turn; j++)
        segments.push(
          { id: 10_000_000 + u * 64 + j * 2, tokens: 100 },
          { id: 10_000_001 + u * 64 + j * 2, tokens: 200 },
        )
      segments.push({ id: 10_000_000 + u * 64 + turn * 2, tokens: 100 })
      add(t, segments, `user-${u}`)
    }
  }
  return out
}

/** Chained hashes of `blockSize`-token blocks of a prompt (same prefix <=> same leading hashes). */
export function blockHashes(segments: readonly Segment[], blockSize: number, seed: number): number[] {
  const out: number[] = []
  let h = seed >>> 0
  let filled = 0
  for (const s of segments) {
    const base = Math.imul(s.id, 0x9e3779b1)
    for (let i = 0; i < s.tokens; i++) {
      h = Math.imul(h ^ ((base + i) | 0), 0x01000193)
      if (++filled === blockSize) {
        h = Math.imul(h ^ (h >>> 15), 0x85ebca6b)
        h = (Math.imul(h ^ (h >>> 13), 0xc2b2ae35) ^ (h >>> 16)) >>> 0
        out.push(h)
        filled = 0
      }
    }
  }
  return out
}
