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
}

export type WorkloadName = 'W1' | 'W2' | 'W3' | 'W4'

export const WORKLOADS: Record<WorkloadName, string> = {
  W1: 'shared prefix: 64 groups x 6k-token prefix, 1k unique suffix, 200 out',
  W2: 'multi-turn chat: 8 turns per user, 1k shared system prompt, history grows, think ~10 s',
  W3: 'no reuse (control): unique 2k prompts, 200 out',
  W4: 'bursts (10 s at 1.6x, 10 s at 0.4x) of W1 prompts; a fast node 5x slower from 60 s to 120 s',
}

/**
 * Mean prompt tokens per request: the fleet's nominal capacity is computed without any cache
 * reuse, so a policy that keeps prefixes cached can serve more than 100% of it.
 */
export const PROMPT_TOKENS_PER_REQUEST: Record<WorkloadName, number> = {
  W1: 7000,
  W2: 2150,
  W3: 2000,
  W4: 7000,
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
  const add = (arrivalMs: number, segments: Segment[], session?: string) =>
    out.push({
      id: out.length,
      arrivalMs,
      segments,
      promptTokens: segments.reduce((s, g) => s + g.tokens, 0),
      outputTokens: OUTPUT_TOKENS,
      session,
    })
  const sharedPrefix = () => [
    { id: 1000 + Math.floor(rng() * 64), tokens: 6000 },
    { id: uniqueSeg++, tokens: 1000 },
  ]
  if (name === 'W1' || name === 'W3') {
    for (let t = exp(rng, 1000 / ratePerSec); t < durationMs; t += exp(rng, 1000 / ratePerSec))
      add(t, name === 'W1' ? sharedPrefix() : [{ id: uniqueSeg++, tokens: 2000 }])
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
