import { encode } from '../tokenizer.ts'

// Common words that are each exactly one o200k_base token with their leading space, so a
// client counting the streamed text with the same tokenizer gets exactly completion_tokens.
const CANDIDATES =
  'the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were her she there been one all we their has would when if so no more out up said what its about than into them can only other time new some could these two may first then do any like my now over such our man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three'.split(
    ' ',
  )

let vocab: string[] | undefined

/** The simulator's output vocabulary (built on first use: it needs the tokenizer). */
export function vocabulary(): readonly string[] {
  vocab ??= CANDIDATES.map((w) => ` ${w}`).filter((w) => encode(w).length === 1)
  return vocab
}

/** mulberry32: a small, fast, seedable PRNG; deterministic text needs nothing better. */
export function prng(seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** `n` words drawn deterministically from `rand`. */
export function words(rand: () => number, n: number): string[] {
  const v = vocabulary()
  const out = new Array<string>(n)
  for (let i = 0; i < n; i++) out[i] = v[Math.floor(rand() * v.length)]!
  return out
}

/** A JSON arguments string for a tool, from its JSON-schema properties. */
export function toolArguments(parameters: unknown): string {
  const props =
    (parameters as { properties?: Record<string, { type?: unknown }> } | undefined)?.properties ?? {}
  const args: Record<string, unknown> = {}
  for (const [name, schema] of Object.entries(props)) {
    const type = schema?.type
    args[name] =
      type === 'string'
        ? 'sim'
        : type === 'number' || type === 'integer'
          ? 1
          : type === 'boolean'
            ? true
            : null
  }
  return JSON.stringify(args)
}
