// The tokenizer (o200k_base through gpt-tokenizer), shared by the pipeline and the simulator.
// Loading it takes a few hundred milliseconds and about 30 MiB, so nothing imports it statically:
// start-up stays fast and small, and the first user (a request that counts tokens) awaits it.
//
// Bounded time whatever the text. gpt-tokenizer runs its byte-pair merge once per pre-tokenizer
// piece (a word, a run of punctuation or of whitespace), and that merge is quadratic in the
// piece's length: 40,000 repeated letters took 8.5 s of the event loop. Text arrives here from
// clients, so no piece longer than MAX_PIECE_BYTES of UTF-8 ever reaches the merge: a longer one
// is cut into chunks of at most that, each encoded alone. Ordinary text (prose, code, JSON,
// base64, URLs) has no piece that long and is encoded exactly as before; what has one is a run
// of one character (Markdown tables' padding) or text with no spaces or punctuation.

type Options = { disallowedSpecial: Set<string> }
interface Lib {
  encode(text: string, options: Options): number[]
  countTokens(text: string, options: Options): number
  setMergeCacheSize(size: number): void
}
/** The library's byte-pair stage, which its own count runs on each piece of the split. */
interface BytePairs {
  getBpeRankFromString(piece: string): number | undefined
  bytePairEncode(piece: string): number[]
  /** The merge itself, without the library's cache (bytePairEncode's inside). */
  bytePairMerge?(bytes: Uint8Array): number[]
}
let lib: Lib | undefined
let pairs: BytePairs | undefined
let loading: Promise<void> | undefined

/**
 * The longest piece given to the byte-pair merge, in bytes of UTF-8. The merge's time per byte
 * grows with the piece: 768-byte chunks of random letters took 11 s per MB, 256-byte ones 1 s.
 */
export const MAX_PIECE_BYTES = 256
// A piece of more than MAX_PIECE_BYTES has more than MAX_UNITS UTF-16 code units (3 bytes at most
// each), so text without a piece that long is safe whole.
const MAX_UNITS = 84
/**
 * Tokens added per cut made in a long piece. Byte-pair encoding is not monotone under cutting:
 * `aab|b` may take fewer tokens than `aabb`. Over 60,000 random cuts in strings of Latin,
 * Cyrillic, CJK, Thai, Arabic, emoji, punctuation, base64, hex, code and whitespace, one cut
 * lowered the count by at most 2; the count of a cut piece gets 3 per cut on top, so it stays
 * at or above the piece's own count (an overestimate only widens a reservation).
 */
export const CUT_MARGIN = 3
// The merge cache keeps pieces of up to MAX_PIECE_BYTES with their tokens (2.5 kB at most each,
// 40 MB in all); the library's default of 100,000 entries of any length could hold gigabytes.
// Only encode() (the simulator) uses it: counting has its own (COUNT_CACHE_ENTRIES below).
const MERGE_CACHE_ENTRIES = 16_384
/**
 * Counting's cache: a piece of the split to its count (1 for a piece that is one token). The
 * library's merge cache is a least-recently-used `Map` of pieces to arrays of tokens, and every
 * hit moves its entry to the back (a delete and a set): a router's cache is old, so every
 * request's hits wrote it, and each of JavaScriptCore's young collections marked all of it again
 * (after 300 prompts of 16 KB in several scripts, a young collection took 2.3 ms against 0.36
 * with this one). This one is written only on a miss and holds numbers: a steady load's words
 * are all hits. It also answers single-token pieces, a lookup in a small map instead of the
 * 200,000 tokens' one (those prompts counted in 0.87 ms against 1.21). Full, it starts again
 * empty; pieces are at most MAX_PIECE_BYTES, so it holds 4 MB at most (copies: see pieceCount).
 */
const COUNT_CACHE_ENTRIES = 16_384
const counts = new Map<string, number>()
const utf8 = new TextEncoder()
const decoder = new TextDecoder()
// o200k_base's pre-tokenizer, the library's own (a copy: this one's lastIndex is ours), to find
// long pieces.
let split: RegExp | undefined
// The same again for counting, which runs inside forEachSpan's walk of `split`; and sticky.
let pieces: RegExp | undefined
let piecesSticky: RegExp | undefined
// Special tokens' text (`<|endoftext|>`) is counted as the text it is: a prompt may hold it, and
// the library's default would throw on it (and scan every text for them first).
const PLAIN: Options = { disallowedSpecial: new Set() }

/**
 * Where the tables are: inside the executable, the build's entry at its fixed path in Bun's
 * embedded file system (a static import would put them into every bundle that counts tokens,
 * mapped at start whether used or not); from source, the file beside this one.
 */
const TABLES = Bun.main.startsWith('/$bunfs/')
  ? '/$bunfs/root/tokenizer-tables.js'
  : new URL('./tokenizer-tables.ts', import.meta.url).href

export function loadTokenizer(): Promise<void> {
  loading ??= (import(TABLES) as Promise<typeof import('./tokenizer-tables.ts')>).then((m) => {
    m.setMergeCacheSize(MERGE_CACHE_ENTRIES)
    classes = buildClasses()
    const re = m.O200K_TOKEN_SPLIT_REGEX
    split = new RegExp(re.source, re.flags)
    pieces = new RegExp(re.source, re.flags)
    piecesSticky = new RegExp(re.source, `${re.flags.replace('g', '')}y`)
    const core = (m.encoding as unknown as { bytePairEncodingCoreProcessor?: BytePairs })
      .bytePairEncodingCoreProcessor
    if (typeof core?.getBpeRankFromString === 'function' && typeof core.bytePairEncode === 'function')
      pairs = core
    lib = m as unknown as Lib
  })
  return loading
}

export function tokenizerLoaded(): boolean {
  return lib !== undefined
}

function loaded(): Lib {
  if (!lib) throw new Error('tokenizer not loaded: await loadTokenizer() first')
  return lib
}

/**
 * Token ids of a text; the tokenizer must have been loaded. Exact o200k_base for any text whose
 * pre-tokenizer pieces are at most MAX_PIECE_BYTES long; a longer piece is encoded in chunks.
 */
export function encode(text: string): number[] {
  const l = loaded()
  if (!hasLongRun(text)) return l.encode(text, PLAIN)
  const out: number[] = []
  forEachSpan(text, (span, long) => {
    if (!long) {
      for (const t of l.encode(span, PLAIN)) out.push(t)
      return
    }
    for (let at = 0; at < span.length; ) {
      const end = chunkEnd(span, at)
      for (const t of l.encode(span.slice(at, end), PLAIN)) out.push(t)
      at = end
    }
  })
  return out
}

/**
 * Tokens of a text, in time linear in its length. Exact for any text whose pieces are at most
 * MAX_PIECE_BYTES long (all ordinary text); a longer piece counts its chunks plus CUT_MARGIN per
 * cut and per end of the piece, which keeps it at or above its exact count.
 */
export function countTokens(text: string): number {
  const l = loaded()
  if (!hasLongRun(text)) return countPlain(l, text)
  let n = 0
  forEachSpan(text, (span, long) => {
    if (!long) {
      n += countPlain(l, span)
      return
    }
    // the cuts inside the piece and its two ends (the whitespace before it may split otherwise)
    n += CUT_MARGIN
    for (let at = 0; at < span.length; ) {
      const end = chunkEnd(span, at)
      n += countPlain(l, span.slice(at, end)) + CUT_MARGIN
      at = end
    }
  })
  return n
}

/**
 * o200k's split for text of ASCII alone: the library's pattern with each Unicode property class
 * written as the ASCII characters it holds (\p{Lu} and \p{Lt} as A-Z, \p{Ll} as a-z, \p{L} as
 * A-Za-z, \p{N} as 0-9; \p{Lm}, \p{Lo} and \p{M} hold none), and no `u` flag. On ASCII it cuts
 * the same pieces (test/unit/tokens.test.ts compares them on random text). Why: it keeps most
 * prompts, which are ASCII, off the engine's Unicode path: a 20 KB ASCII prompt counts in 0.43 ms
 * against 0.49-0.50 with the library's split. It was written for a suspected effect on
 * JavaScriptCore's young-generation collections that three alternated runs over HTTP on a quiet
 * machine did not show (bench/results/2026-11-26h-perf-probes.md).
 */
const ASCII_SPLIT =
  /[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+(?:'(?:[sS]|[dD]|[mM]|[tT]|[lL][lL]|[vV][eE]|[rR][eE]))?|[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*(?:'(?:[sS]|[dD]|[mM]|[tT]|[lL][lL]|[vV][eE]|[rR][eE]))?|[0-9]{1,3}| ?[^\sA-Za-z0-9]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+/g
const ASCII_STICKY = new RegExp(ASCII_SPLIT.source, 'y')
// biome-ignore lint/suspicious/noControlCharactersInRegex: the range is every non-ASCII code unit
const NON_ASCII = /[^\x00-\x7f]/

/**
 * The library's count with no special tokens (PLAIN): each piece of o200k's split is one token
 * or its merge's, the library's own count (`countNative`) with our cache. ASCII text is split by
 * ASCII_SPLIT.
 */
function countPlain(l: Lib, text: string): number {
  const bp = pairs
  if (bp === undefined) return l.countTokens(text, PLAIN)
  const ascii = !NON_ASCII.test(text)
  // The split is total (some alternative matches at every position), so each piece starts where
  // the last ended: a sticky regex's test() finds its end with no match array made. Should a
  // position match nothing, the global regex's search takes over from there, as the library's.
  const sticky = ascii ? ASCII_STICKY : piecesSticky!
  let at = 0
  let n = 0
  sticky.lastIndex = 0
  while (at < text.length) {
    if (!sticky.test(text) || sticky.lastIndex === at) {
      const re = ascii ? ASCII_SPLIT : pieces!
      re.lastIndex = at
      for (let m = re.exec(text); m !== null; m = re.exec(text)) n += pieceCount(bp, m[0])
      return n
    }
    const end = sticky.lastIndex
    n += pieceCount(bp, text.slice(at, end))
    at = end
  }
  return n
}

/** One piece's tokens, from counting's cache or the merge. */
function pieceCount(bp: BytePairs, piece: string): number {
  let c = counts.get(piece)
  if (c !== undefined) return c
  let bytes: Uint8Array | undefined
  if (bp.getBpeRankFromString(piece) !== undefined) c = 1
  else if (bp.bytePairMerge) {
    bytes = utf8.encode(piece)
    c = bp.bytePairMerge(bytes).length
  } else c = bp.bytePairEncode(piece).length
  if (counts.size >= COUNT_CACHE_ENTRIES) counts.clear()
  // A piece of more than 12 code units shares its storage with the text it was cut from (JSC):
  // kept as it is, it would keep the whole prompt alive. A copy is kept instead (and nothing
  // when the piece holds a lone surrogate, which the copy through UTF-8 would not keep).
  if (piece.length <= 12) counts.set(piece, c)
  else {
    const own = decoder.decode(bytes ?? utf8.encode(piece))
    if (own === piece) counts.set(own, c)
  }
  return c
}

/** The pieces o200k's split cuts ASCII text into, by the library's pattern and by ASCII_SPLIT (for tests). */
export function asciiSplitPieces(text: string): { library: string[]; ascii: string[] } {
  loaded()
  const re = split!
  return {
    library: [...text.matchAll(new RegExp(re.source, re.flags))].map((m) => m[0]),
    ascii: [...text.matchAll(new RegExp(ASCII_SPLIT.source, ASCII_SPLIT.flags))].map((m) => m[0]),
  }
}

// What each UTF-16 code unit can be in o200k's split, as bits (built at load, 64 KB): \s; a
// letter or mark (\p{L}, \p{M}); a character of a punctuation run ([^\s\p{L}\p{N}], marks
// included); one of \r \n /. Half a surrogate pair may be a letter or a symbol: both bits.
const WS = 1
const LETTER = 2
const PUNCT = 4
const SLASH = 8
let classes: Uint8Array | undefined

function buildClasses(): Uint8Array {
  const t = new Uint8Array(0x10000)
  const letter = /[\p{L}\p{M}]/u
  const punct = /[^\s\p{L}\p{N}]/u
  for (let c = 0; c < 0x10000; c++) {
    if (c >= 0xd800 && c <= 0xdfff) {
      t[c] = LETTER | PUNCT
      continue
    }
    const ch = String.fromCharCode(c)
    t[c] =
      (/\s/.test(ch) ? WS : 0) |
      (letter.test(ch) ? LETTER : 0) |
      (punct.test(ch) ? PUNCT : 0) |
      (c === 10 || c === 13 || c === 47 ? SLASH : 0)
  }
  return t
}

// A piece of the split longer than MAX_UNITS is a letter run (one leading character, letters and
// marks, a contraction of at most 3), a punctuation run with one leading space and a run of
// \r \n /, or a whitespace run (digits come 3 at most): it holds a run of at least this many
// code units of one kind.
const LETTER_RUN = MAX_UNITS - 3
const PUNCT_RUN = MAX_UNITS / 2
const WS_RUN = MAX_UNITS
// Every run of PUNCT_RUN or more holds two samples STEP apart.
const STEP = PUNCT_RUN / 2

/**
 * Whether the text may hold a pre-tokenizer piece longer than MAX_UNITS (one that may be longer
 * than MAX_PIECE_BYTES): never false when it does. It looks only where two samples STEP apart
 * share a kind: about one code unit in 20 for ordinary text.
 */
export function hasLongRun(text: string): boolean {
  if (text.length <= MAX_UNITS) return false
  const k = classes!
  for (let p = 0; p + STEP < text.length; p += STEP) {
    const both = k[text.charCodeAt(p)]! & k[text.charCodeAt(p + STEP)]!
    if (both === 0) continue
    if (both & LETTER && runAround(text, p, LETTER) >= LETTER_RUN) return true
    if (both & PUNCT && runAround(text, p, PUNCT) >= PUNCT_RUN) return true
    if (both & SLASH && runAround(text, p, SLASH) >= PUNCT_RUN) return true
    if (both & WS && runAround(text, p, WS) >= WS_RUN) return true
  }
  return false
}

/** The length of the run of `kind` through p and p + STEP; 0 when it does not reach p + STEP. */
function runAround(text: string, p: number, kind: number): number {
  const k = classes!
  let end = p + 1
  while (end <= p + STEP && k[text.charCodeAt(end)]! & kind) end++
  if (end <= p + STEP) return 0
  while (end < text.length && k[text.charCodeAt(end)]! & kind) end++
  let start = p
  while (start > 0 && k[text.charCodeAt(start - 1)]! & kind) start--
  return end - start
}

/**
 * Walks the text as spans cut at the boundaries of pieces longer than MAX_PIECE_BYTES: each such
 * piece is a span (long), and the text between two of them another (encoded whole, exactly).
 */
function forEachSpan(text: string, f: (span: string, long: boolean) => void): void {
  const re = split!
  let from = 0
  re.lastIndex = 0
  for (let m = re.exec(text); m !== null; m = re.exec(text)) {
    const piece = m[0]
    if (piece.length <= MAX_UNITS || utf8Length(piece) <= MAX_PIECE_BYTES) continue
    if (m.index > from) f(text.slice(from, m.index), false)
    f(piece, true)
    from = m.index + piece.length
  }
  if (from < text.length) f(from === 0 ? text : text.slice(from), false)
}

/** UTF-8 bytes of a code unit (a surrogate pair's four bytes are two per half). */
function unitBytes(c: number): number {
  return c < 0x80 ? 1 : c < 0x800 || (c >= 0xd800 && c <= 0xdfff) ? 2 : 3
}

function utf8Length(s: string): number {
  let n = 0
  for (let i = 0; i < s.length; i++) n += unitBytes(s.charCodeAt(i))
  return n
}

/** The end of the chunk starting at `at`: MAX_PIECE_BYTES at most, not splitting a surrogate pair. */
function chunkEnd(s: string, at: number): number {
  let end = at
  for (let bytes = 0; end < s.length; end++) {
    bytes += unitBytes(s.charCodeAt(end))
    if (bytes > MAX_PIECE_BYTES) break
  }
  if (end < s.length && end > at + 1) {
    const c = s.charCodeAt(end)
    if (c >= 0xdc00 && c <= 0xdfff) end--
  }
  return end
}
