import type { ChatMessage } from '../api/chat.ts'
import { CUT_MARGIN, countTokens as count } from '../tokenizer.ts'

export { loadTokenizer, tokenizerLoaded as tokenizerReady } from '../tokenizer.ts'

/** o200k_base tokens of a text, in time linear in its length (see tokenizer.ts). */
export function countTokens(text: string): number {
  return text.length === 0 ? 0 : count(text)
}

// Counting is CPU on the event loop (up to about 1.5 s per MB for text made to be slow, such as
// random letters): the live endpoints count about SLICE code units at a time (tens of ms at
// worst) and let other requests run in between, and stop once past the model's context.
const SLICE = 8192
const yieldToLoop = () => new Promise<void>((resolve) => setImmediate(resolve))

/**
 * Long texts' counts by their SHA-256. Requests repeat long texts: a system prompt, a shared
 * document, an agent's whole history again at every turn. Counting 16 KB of English takes about
 * 0.55 ms of the event loop, its SHA-256 about 15 us, so a text seen before is looked up instead.
 * The digest, not the text, is kept: no prompt outlives its request here. The digest is of the
 * organization's id with the text, so a lookup's speed tells a client nothing of another
 * organization's prompts. A text's count is the same wherever it is counted on this path (whole
 * up to SLICE, in slices past it: both depend on the text alone), so a hit gives exactly what
 * counting would. Only well-formed text is looked up (UTF-8, which the digest is of, writes
 * every lone surrogate the same way); texts longer than CACHED_MAX_CHARS are counted a slice at a
 * time as before (their digest would hold the event loop). Full, it starts again empty.
 */
const CACHED_MIN_CHARS = 512
const CACHED_MAX_CHARS = 64 * 1024
const CACHED_TEXTS = 8192
const textCounts = new Map<string, number>()

/** The key of a text worth looking up (an organization's); undefined for one that is not. */
function textKey(scope: string | undefined, text: string): string | undefined {
  if (
    scope === undefined ||
    text.length < CACHED_MIN_CHARS ||
    text.length > CACHED_MAX_CHARS ||
    !text.isWellFormed()
  )
    return undefined
  return new Bun.CryptoHasher('sha256').update(scope).update('\u0000').update(text).digest('base64')
}

/** Texts whose counts are kept (for tests). */
export function countsKept(): number {
  return textCounts.size
}

function remember(key: string, n: number): void {
  if (textCounts.size >= CACHED_TEXTS) textCounts.clear()
  textCounts.set(key, n)
}

/**
 * Counts texts for one request without holding the event loop for more than SLICE code units:
 * a text that would cross that is counted in slices, with a turn of the event loop before each.
 * The sum stays at or above countTokens': a slice ends before a space that follows a non-space
 * (always a boundary of the split, so exact), or where there is none, anywhere, plus CUT_MARGIN.
 */
export class PromptCounter {
  private since = 0
  /** Tokens counted so far. */
  n = 0

  constructor(
    /** Counting stops once past this: the request is refused anyway. */
    public limit = Number.POSITIVE_INFINITY,
    /**
     * The organization whose long texts are looked up by their digest; undefined for none (a
     * stream's answer, embeddings' inputs: seen once, they would only push prompts out).
     */
    private readonly scope?: string,
  ) {}

  get over(): boolean {
    return this.n > this.limit
  }

  /** Adds a text's tokens; a promise when it had to let the event loop run (await it). */
  add(text: string): Promise<void> | undefined {
    const key = textKey(this.scope, text)
    if (key !== undefined) {
      const known = textCounts.get(key)
      if (known !== undefined) {
        this.n += known
        return undefined
      }
    }
    if (this.since + text.length <= SLICE) {
      this.since += text.length
      const n = countTokens(text)
      this.n += n
      if (key !== undefined) remember(key, n)
      return undefined
    }
    return this.addSliced(text, key)
  }

  private async addSliced(text: string, key: string | undefined): Promise<void> {
    const before = this.n
    let at = 0
    while (at < text.length && !this.over) {
      if (this.since > 0) {
        await yieldToLoop()
        this.since = 0
      }
      const end = sliceEnd(text, at)
      this.n += countTokens(at === 0 && end === text.length ? text : text.slice(at, end))
      if (end < text.length && !exactCut(text, end)) this.n += CUT_MARGIN
      this.since = end - at
      at = end
    }
    // Only a whole count is kept (one cut short past the limit is not the text's).
    if (key !== undefined && at >= text.length) remember(key, this.n - before)
  }
}

/** Where the slice from `at` ends: at an exact cut a little past SLICE, at the end when that is near, or else at SLICE. */
function sliceEnd(text: string, at: number): number {
  const end = at + SLICE
  if (end >= text.length) return text.length
  const stop = Math.min(text.length, end + 1024)
  for (let i = end; i < stop; i++) if (exactCut(text, i)) return i
  // Less than 1 KiB left with no exact cut: the rest goes in this slice (no margin needed).
  if (stop === text.length) return text.length
  const c = text.charCodeAt(end)
  return c >= 0xdc00 && c <= 0xdfff ? end - 1 : end
}

/**
 * A space after a non-space always starts a piece of o200k's split (no piece holds a space but as
 * its first character, and a whitespace piece cannot hold the non-space): counting the text
 * before it and from it apart gives exactly the count of the whole.
 */
function exactCut(text: string, i: number): boolean {
  return text.charCodeAt(i) === 32 && !WHITESPACE.test(text[i - 1]!)
}
const WHITESPACE = /\s/

/** Texts up to this long are counted in one go (countTokensYielding slices longer ones). */
export const COUNT_SLICE_CHARS = SLICE

/**
 * countTokens for a long text without holding the event loop (a stream's answer, cut short): a
 * slice at a time as PromptCounter does, exact where a slice ends before a space.
 */
export async function countTokensYielding(text: string): Promise<number> {
  const counter = new PromptCounter()
  await counter.add(text)
  return counter.n
}

/**
 * Prompt tokens to reserve for: Tropa's count plus half again and 16. Upstream models use their
 * own tokenizers (a llama vocabulary counted 22 tokens where o200k counted 12); the margin keeps
 * the charge, which never exceeds the reservation, equal to what the upstream reports.
 */
export function reservedPromptTokens(counted: number): number {
  return counted + Math.ceil(counted / 2) + 16
}

// Per-message framing tokens, as OpenAI counts them for its chat models.
const PER_MESSAGE = 3
const REPLY_PRIMING = 3
// Images cost what OpenAI bills for a 1024x1024 image at high detail unless asked for low:
// an overestimate is safe (it only widens the reservation), an underestimate is not.
const IMAGE_LOW = 85
const IMAGE_HIGH = 765

/** Prompt tokens of a chat request as Tropa counts them for the context check and the reservation. */
export function countChatPrompt(
  messages: readonly ChatMessage[],
  tools: readonly unknown[] | undefined,
): number {
  let n = 0
  const fixed = promptParts(messages, tools, (text) => {
    n += countTokens(text)
  })
  return fixed + n
}

/**
 * countChatPrompt for the live endpoint: the same count, without holding the event loop on a
 * long prompt, and stopping once past `limit` (the request is refused then anyway). A number
 * when the prompt is short (no promise, no turn of the event loop), else a promise of it.
 */
export function countChatPromptLive(
  messages: readonly ChatMessage[],
  tools: readonly unknown[] | undefined,
  limit: number,
  /** The organization whose long texts are looked up (PromptCounter). */
  scope?: string,
): number | Promise<number> {
  // Texts of SLICE at most in all: the counter counts each whole (add returns no promise).
  const counter = new PromptCounter(Number.POSITIVE_INFINITY, scope)
  let size = 0
  const fixed = promptParts(messages, tools, (text) => {
    size += text.length
    if (size <= SLICE) counter.add(text)
  })
  return size <= SLICE ? fixed + counter.n : countChatPromptSliced(messages, tools, limit, scope)
}

async function countChatPromptSliced(
  messages: readonly ChatMessage[],
  tools: readonly unknown[] | undefined,
  limit: number,
  scope: string | undefined,
): Promise<number> {
  const texts: string[] = []
  const fixed = promptParts(messages, tools, (text) => texts.push(text))
  const counter = new PromptCounter(limit - fixed, scope)
  for (const text of texts) {
    if (counter.over) break
    const slow = counter.add(text)
    if (slow) await slow
  }
  return fixed + counter.n
}

/** Walks a chat prompt: hands each text to count to `text`, returns the tokens counted without it. */
function promptParts(
  messages: readonly ChatMessage[],
  tools: readonly unknown[] | undefined,
  text: (t: string) => void,
): number {
  let n = REPLY_PRIMING
  for (const m of messages) {
    n += PER_MESSAGE + 1
    if (m.name) {
      text(m.name)
      n += 1
    }
    const c = m.content
    if (typeof c === 'string') text(c)
    else if (Array.isArray(c)) {
      for (const part of c) {
        switch (part.type) {
          case 'text':
            text(part.text)
            break
          case 'refusal':
            text(part.refusal)
            break
          case 'image_url':
            n += part.image_url.detail === 'low' ? IMAGE_LOW : IMAGE_HIGH
            break
          case 'input_audio':
            // about 10 tokens per second of audio; 16 kB of base64 is roughly a second
            n += Math.ceil(part.input_audio.data.length / 1600)
            break
          case 'file':
            n += Math.ceil(JSON.stringify(part.file).length / 4)
            break
        }
      }
    }
    if (m.tool_calls) text(JSON.stringify(m.tool_calls))
  }
  if (tools && tools.length > 0) text(JSON.stringify(tools))
  return n
}
