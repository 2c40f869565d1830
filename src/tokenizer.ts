// The tokenizer (o200k_base through gpt-tokenizer), shared by the pipeline and the simulator.
// Loading it takes a few hundred milliseconds, so nothing imports it statically: start-up stays
// fast, main.ts starts the load once the server listens, and the first user awaits it.
//
// Bounded time whatever the text. gpt-tokenizer runs its byte-pair merge once per pre-tokenizer
// piece (a word, a run of punctuation or of whitespace), and that merge is quadratic in the
// piece's length: 40,000 repeated letters took 8.5 s of the event loop. Text arrives here from
// clients, so no piece longer than MAX_PIECE_BYTES of UTF-8 ever reaches the merge: a longer one
// is cut into chunks of at most that, each encoded alone. Ordinary text (prose, code, JSON,
// base64, URLs, Markdown tables) has no piece that long and is encoded exactly as before.

type Options = { disallowedSpecial: Set<string> }
interface Lib {
  encode(text: string, options: Options): number[]
  countTokens(text: string, options: Options): number
  setMergeCacheSize(size: number): void
}
let lib: Lib | undefined
let loading: Promise<void> | undefined

/** The longest piece given to the byte-pair merge, in bytes of UTF-8. */
export const MAX_PIECE_BYTES = 768
// A piece of more than MAX_PIECE_BYTES has more than MAX_UNITS UTF-16 code units (3 bytes at most
// each), so text without a piece that long is safe whole.
const MAX_UNITS = MAX_PIECE_BYTES / 3
/**
 * Tokens added per cut made in a long piece. Byte-pair encoding is not monotone under cutting:
 * `aab|b` may take fewer tokens than `aabb`. Over 60,000 random cuts in strings of Latin,
 * Cyrillic, CJK, Thai, Arabic, emoji, punctuation, base64, hex, code and whitespace, one cut
 * lowered the count by at most 2; the count of a cut piece gets 3 per cut on top, so it stays
 * at or above the piece's own count (an overestimate only widens a reservation).
 */
export const CUT_MARGIN = 3
// A pre-tokenizer piece longer than MAX_UNITS holds a run of at least RUN code units that are all
// whitespace, all non-whitespace, or all of \r \n / (see hasLongRun); text without one is safe.
const RUN = MAX_UNITS / 2
// The merge cache keeps pieces up to MAX_PIECE_BYTES long with their tokens (a few kB each):
// the library's default of 100,000 entries could hold hundreds of MB of adversarial pieces.
const MERGE_CACHE_ENTRIES = 16_384
// o200k_base's pre-tokenizer, the library's own (a copy: this one's lastIndex is ours), to find
// long pieces.
let split: RegExp | undefined
// Special tokens' text (`<|endoftext|>`) is counted as the text it is: a prompt may hold it, and
// the library's default would throw on it (and scan every text for them first).
const PLAIN: Options = { disallowedSpecial: new Set() }

export function loadTokenizer(): Promise<void> {
  loading ??= Promise.all([import('gpt-tokenizer'), import('gpt-tokenizer/encodingParams/constants')]).then(
    ([m, c]) => {
      m.setMergeCacheSize(MERGE_CACHE_ENTRIES)
      split = new RegExp(c.O200K_TOKEN_SPLIT_REGEX.source, c.O200K_TOKEN_SPLIT_REGEX.flags)
      lib = m as unknown as Lib
    },
  )
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
  if (!hasLongRun(text)) return l.countTokens(text, PLAIN)
  let n = 0
  forEachSpan(text, (span, long) => {
    if (!long) {
      n += l.countTokens(span, PLAIN)
      return
    }
    // the cuts inside the piece and its two ends (the whitespace before it may split otherwise)
    n += CUT_MARGIN
    for (let at = 0; at < span.length; ) {
      const end = chunkEnd(span, at)
      n += l.countTokens(span.slice(at, end), PLAIN) + CUT_MARGIN
      at = end
    }
  })
  return n
}

/**
 * Whether the text may hold a pre-tokenizer piece longer than MAX_UNITS. Every piece of o200k's
 * split is a letter run (with one leading character and a contraction), at most three digits,
 * an optional space with a punctuation run and a run of \r \n /, or a whitespace run: one longer
 * than MAX_UNITS = 2 x RUN holds a run of RUN code units of one of those three kinds.
 */
export function hasLongRun(text: string): boolean {
  if (text.length <= MAX_UNITS) return false
  // A run of RUN code units holds two samples STEP apart: look only where two samples agree.
  for (let p = 0; p + STEP < text.length; p += STEP) {
    const a = text.charCodeAt(p)
    const b = text.charCodeAt(p + STEP)
    const space = isSpace(a)
    if (space === isSpace(b) && runAround(text, p, space ? isSpace : isNotSpace) >= RUN) return true
    if (isSlashOrNewline(a) && isSlashOrNewline(b) && runAround(text, p, isSlashOrNewline) >= RUN) return true
  }
  return false
}
const STEP = RUN / 2

/** The length of the run of `kind` through p and p + STEP; 0 when it does not reach p + STEP. */
function runAround(text: string, p: number, kind: (c: number) => boolean): number {
  let end = p + 1
  while (end <= p + STEP && kind(text.charCodeAt(end))) end++
  if (end <= p + STEP) return 0
  while (end < text.length && kind(text.charCodeAt(end))) end++
  let start = p
  while (start > 0 && kind(text.charCodeAt(start - 1))) start--
  return end - start
}

const isNotSpace = (c: number) => !isSpace(c)
const isSlashOrNewline = (c: number) => c === 10 || c === 13 || c === 47

/** JavaScript's \s (WhiteSpace and LineTerminator), which the split regex uses. */
function isSpace(c: number): boolean {
  if (c <= 32) return c === 32 || (c >= 9 && c <= 13)
  if (c < 160) return false
  return (
    c === 160 ||
    c === 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) ||
    c === 0x2028 ||
    c === 0x2029 ||
    c === 0x202f ||
    c === 0x205f ||
    c === 0x3000 ||
    c === 0xfeff
  )
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
