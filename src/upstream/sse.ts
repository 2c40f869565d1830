/** An SSE event that is an error (vLLM and others send some this way, inside a 200 stream). */
export const ERROR_EVENT = /^data:\s*\{\s*"error"/

/** Token counts as an upstream reports them. */
export interface Usage {
  prompt_tokens: number
  completion_tokens: number
  total_tokens?: number
  prompt_tokens_details?: { cached_tokens?: number } | null
  /** Added by Tropa: what the request was charged, roubles. */
  cost_rub?: number
  /** Added by Tropa: true when these are Tropa's own counts (the upstream sent none it could bill). */
  estimated?: boolean
  /** Added by Tropa: the signed receipt of the charge (docs/api.md, "Receipts"). */
  receipt?: string
}

const MAX_TOKENS_REPORTED = 2 ** 31 - 1
const saneCount = (x: unknown): x is number =>
  Number.isSafeInteger(x) && (x as number) >= 0 && (x as number) <= MAX_TOKENS_REPORTED

/**
 * Usage as an upstream reports it is untrusted input: only whole, non-negative, sane counts are
 * billed. Anything else (negative, fractional, text, absurd) is dropped, and Tropa counts itself.
 */
export function sanitizeUsage(u: unknown): Usage | undefined {
  if (!u || typeof u !== 'object') return undefined
  const { prompt_tokens: p, completion_tokens: c } = u as Record<string, unknown>
  if (!saneCount(p) || !saneCount(c)) return undefined
  return u as Usage
}

/** sanitizeUsage for embeddings, whose usage has prompt tokens only. */
export function sanitizePromptUsage(u: unknown): Usage | undefined {
  if (!u || typeof u !== 'object') return undefined
  const p = (u as Record<string, unknown>).prompt_tokens
  return saneCount(p) ? { prompt_tokens: p, completion_tokens: 0 } : undefined
}

/** The usage Tropa bills when the upstream's is missing or not sane: its own counts, marked. */
export function estimatedUsage(promptTokens: number, completionTokens: number): Usage {
  return {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
    estimated: true,
  }
}

// A chunk that carries usage (`"usage": null`, which vLLM sends on every chunk, does not).
const USAGE_FIELD = /"usage"\s*:\s*(?!null\b)\S/
const ID_FIELD = /"id"\s*:\s*"((?:[^"\\]|\\.)*)"/
const EMPTY_CHOICES = /"choices"\s*:\s*\[\s*\]/
const MODEL_FIELD = /"model"\s*:\s*"((?:[^"\\]|\\.)*)"/
const EMPTY_OBJECT = /"object"\s*:\s*""/
const ZERO_CREATED = /"created"\s*:\s*0(?=\s*[,}])/
const encoder = new TextEncoder()
/** Generated text is copied out of the chunks' strings every this many chars (about 1,000 tokens). */
const COPY_AT = 4096
/** Events' payloads are read for their text once this many chars of them wait (about 12 chunks). */
const RAW_AT = 2048
const decoder = new TextDecoder()
/** A string with its own storage, not a view into (or a rope over) bigger strings. */
const copyOf = (s: string): string => decoder.decode(encoder.encode(s))
/**
 * The relays' one decoder (a TextDecoder per stream was 100 bytes of every open stream): each
 * relay keeps the bytes of a character cut at a chunk's end itself. A BOM is kept as text, as a
 * stream decoder keeps one past its start (the first chunk's is dropped by the relay).
 */
const chunkDecoder = new TextDecoder('utf-8', { ignoreBOM: true })

/** The length of `bytes` up to the start of a UTF-8 sequence cut short at its end (all of it if none is). */
export function utf8Whole(bytes: Uint8Array): number {
  const n = bytes.length
  // A sequence is at most 4 bytes: its lead byte is at most 3 back from the end.
  for (let i = n - 1; i >= 0 && i >= n - 3; i--) {
    const b = bytes[i]!
    if ((b & 0xc0) === 0x80) continue
    const need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1
    return n - i < need ? i : n
  }
  return n
}

/**
 * Strings the relays share: the `"model":"…"` fields (a few models, every stream's) kept once
 * rather than once per stream.
 */
const shared = new Map<string, string>()
function sharedString(s: string): string {
  // (An upstream's model name can be long: only short ones are kept past their stream.)
  if (s.length > 256) return copyOf(s)
  const known = shared.get(s)
  if (known !== undefined) return known
  if (shared.size >= 1024) shared.clear()
  const own = copyOf(s)
  shared.set(own, own)
  return own
}

/** What differs between the streams relayed: the chunks' `object`, and where their text is. */
export interface StreamShape {
  /** The `object` of the usage chunk Tropa writes when the upstream sent none. */
  readonly object: string
  /** The generated text's fields (a global regex, its first group the JSON string's body). */
  readonly text: RegExp
}

/**
 * Relays an upstream chat SSE stream (or, with TEXT_COMPLETION_STREAM, a legacy completions one:
 * its chunks carry the same id, model, usage and error fields) event by event. It does not
 * re-serialise chunks: each event's text is forwarded with two substring swaps (the upstream's
 * completion id and model name for Tropa's). It parses only the first event (to learn those two
 * strings), an event that carries usage, and an error event. The usage event is dropped when the
 * client did not ask for it.
 */
export class ChatStreamRelay {
  usage: Usage | undefined
  /** An error event the upstream sent mid-stream. */
  upstreamError: unknown
  sawDone = false
  /** The final usage event was billed. */
  private settled = false
  /**
   * Set while the usage event waits for what onUsage promised (its receipt, signed in a thread):
   * the relay's caller awaits it, then takes the event and the rest with resume(). Nothing is
   * relayed meanwhile (the caller reads no more of the upstream).
   */
  held: Promise<void> | undefined
  private heldText: string | undefined
  /**
   * Pieces of the generated text relayed so far (content, tool names and arguments), to count
   * tokens if the stream ends without usage. Only the text is kept: a few bytes a token, not the
   * events. Each piece is a copy: the text is cut out of the decoded chunks with regexes, and in
   * JSC a substring (and a rope of them) keeps its whole base string alive, so without copies a
   * stream would hold every chunk it relayed (200 bytes a token instead of 5).
   */
  private readonly generatedPieces: string[] = []
  /** The latest generated text, not copied yet (a rope of substrings, under COPY_AT chars). */
  private generatedTail = ''
  /**
   * The latest events' payloads whose text is not read yet (under RAW_AT chars): read together
   * when they reach it, or when the text is asked for. A stream whose usage comes (nearly all)
   * never reads the text of its last events, and one regex over many events costs less than one
   * over each.
   */
  private raw = ''
  private buffer = ''
  /** A character's first bytes, cut at the last chunk's end: decoded with the next chunk. */
  private carry: Uint8Array | undefined
  private started = false
  private idFrom: string | undefined
  private idTo: string
  private modelFrom: string | undefined
  private modelTo: string

  constructor(
    private readonly completionId: string,
    private readonly modelId: string,
    private readonly includeUsage: boolean,
    /**
     * Called once, with the final usage event or at [DONE], with the upstream's usage when it is
     * sane (undefined otherwise): settles, and returns the usage the client is shown (the billed
     * counts with their cost, marked estimated when they are Tropa's own).
     */
    private readonly onUsage: (usage: Usage | undefined) => Usage | Promise<Usage>,
    private readonly shape: StreamShape = CHAT_STREAM,
  ) {
    this.idTo = `"id":${JSON.stringify(completionId)}`
    this.modelTo = sharedString(`"model":${JSON.stringify(modelId)}`)
  }

  /**
   * Feeds upstream bytes; returns the text to send to the client now (undefined if none). Text,
   * not bytes: Bun's direct stream writes a string into the socket as UTF-8 itself, which costs
   * less than encoding it into a new array first (2-3% of a stream's event-loop CPU).
   */
  push(chunk: Uint8Array): string | undefined {
    this.buffer += this.decode(chunk)
    if (this.buffer.includes('\r')) this.buffer = this.buffer.replaceAll('\r\n', '\n')
    const out = this.events()
    return out.length > 0 ? out : undefined
  }

  /** A chunk's text, as a stream decoder would give it (a character cut at its end waits for the next). */
  private decode(chunk: Uint8Array): string {
    let bytes = chunk
    const carry = this.carry
    if (carry) {
      bytes = new Uint8Array(carry.length + chunk.length)
      bytes.set(carry)
      bytes.set(chunk, carry.length)
      this.carry = undefined
    }
    const whole = utf8Whole(bytes)
    if (whole < bytes.length) {
      // A copy (a Buffer's slice is a view: it would keep the socket's whole read alive).
      this.carry = Uint8Array.prototype.slice.call(bytes, whole)
      bytes = bytes.subarray(0, whole)
    }
    const text = chunkDecoder.decode(bytes)
    if (this.started) return text
    this.started = text.length > 0
    return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text
  }

  /** After `held` settled: the usage event it held, then the events buffered behind it. */
  resume(): string | undefined {
    const text = this.heldText ?? ''
    this.held = undefined
    this.heldText = undefined
    const out = text + this.events()
    return out.length > 0 ? out : undefined
  }

  /** The whole events buffered, relayed; stops after an event that is held. */
  private events(): string {
    let out = ''
    let start = 0
    while (this.held === undefined) {
      const end = this.buffer.indexOf('\n\n', start)
      if (end < 0) break
      out += this.event(this.buffer.slice(start, end + 2))
      start = end + 2
    }
    if (start > 0) this.buffer = this.buffer.slice(start)
    return out
  }

  /** The event `shown` makes, now or (a promise) once it is known: then it is held. */
  private usageEvent(shown: Usage | Promise<Usage>, text: (u: Usage) => string): string {
    if (!(shown instanceof Promise)) return text(shown)
    this.held = shown.then(
      (u) => {
        this.heldText = text(u)
      },
      () => {
        this.heldText = ''
      },
    )
    return ''
  }

  /** Whatever is left when the upstream closes (an event without its blank line). */
  end(): string | undefined {
    if (this.carry) this.buffer += chunkDecoder.decode(this.carry)
    this.carry = undefined
    if (this.buffer.trim().length === 0) return undefined
    const rest = this.event(`${this.buffer.trimEnd()}\n\n`)
    this.buffer = ''
    return rest.length > 0 ? rest : undefined
  }

  private event(text: string): string {
    if (!text.startsWith('data:')) return text // comments, `event:` lines: pass through
    const payload = text.slice(text.charCodeAt(5) === 32 ? 6 : 5).trimEnd()
    if (payload === '[DONE]') {
      this.sawDone = true
      // No final usage event came: settle now, and show the client what it was billed.
      if (this.settled || this.idFrom === undefined) return text
      this.settled = true
      const shown = this.onUsage(this.usage)
      if (!this.includeUsage) return text
      const usageEvent = { id: this.completionId, object: this.shape.object, model: this.modelId }
      return this.usageEvent(
        shown,
        (u) =>
          `data: ${JSON.stringify({ ...usageEvent, created: Math.floor(Date.now() / 1000), choices: [], usage: u })}\n\n${text}`,
      )
    }
    if (this.idFrom === undefined) {
      const opening = this.learn(payload, text)
      if (opening !== undefined) return opening
    }
    if (payload.includes('"usage"') && USAGE_FIELD.test(payload)) {
      const parsed = safeParse(payload) as
        | { id?: string; model?: string; usage?: unknown; choices?: unknown[] }
        | undefined
      const usage = sanitizeUsage(parsed?.usage)
      // Cumulative usage may ride on every chunk (vLLM's continuous_usage_stats): keep the
      // latest, and settle only on the final usage event (empty choices) or at the stream's end.
      if (usage) this.usage = usage
      const final = Array.isArray(parsed?.choices) && parsed.choices.length === 0
      if (final && parsed && !this.settled) {
        this.settled = true
        // Billed from the usage: the generated text will not be asked for.
        if (usage) this.raw = ''
        // The upstream's usage with its cost, or (when it is not sane) Tropa's estimate.
        const shown = this.onUsage(usage)
        if (!this.includeUsage) return ''
        // The one event Tropa re-serialises: its usage is the one billed.
        parsed.id = this.completionId
        parsed.model = this.modelId
        return this.usageEvent(shown, (u) => {
          parsed.usage = u
          return `data: ${JSON.stringify(parsed)}\n\n`
        })
      }
      if (!final) this.addRaw(payload)
      if (!this.includeUsage && final) return ''
    } else if (!payload.startsWith('{"id"') && /^\{\s*"error"/.test(payload)) {
      // (chunks start with "id": the regex runs only on what may be an error event)
      this.upstreamError = safeParse(payload) ?? payload
      return ''
    } else {
      this.addRaw(payload)
    }
    return this.rewrite(text)
  }

  private addRaw(payload: string): void {
    // A newline between two events: the text regex cannot match across one (a JSON string has
    // no raw newline), and each payload is a whole event.
    this.raw = this.raw.length === 0 ? payload : `${this.raw}\n${payload}`
    if (this.raw.length >= RAW_AT) this.readRaw()
  }

  private readRaw(): void {
    if (this.raw.length === 0) return
    this.addGenerated(deltaText(this.raw, this.shape.text))
    this.raw = ''
  }

  private addGenerated(text: string): void {
    this.generatedTail += text
    if (this.generatedTail.length >= COPY_AT) {
      this.generatedPieces.push(copyOf(this.generatedTail))
      this.generatedTail = ''
    }
  }

  /** The generated text relayed so far. */
  get generated(): string {
    this.readRaw()
    return this.generatedPieces.length === 0
      ? this.generatedTail
      : this.generatedPieces.join('') + this.generatedTail
  }

  /**
   * Learns the upstream's id and model strings from its first event. Azure opens a stream with an
   * event of empty id, model and choices (and no usage, or `"usage":null`) carrying only its
   * prompt_filter_results: that one is relayed with Tropa's id and model (returned), and the
   * strings are learnt from the next event.
   */
  private learn(payload: string, text: string): string | undefined {
    const id = ID_FIELD.exec(payload)
    const model = MODEL_FIELD.exec(payload)
    if (id?.[1] === '' && EMPTY_CHOICES.test(payload) && !USAGE_FIELD.test(payload)) {
      text = text.replace(id[0], () => this.idTo)
      const m = MODEL_FIELD.exec(text)
      if (m?.[1] === '') text = text.replace(m[0], () => this.modelTo)
      // Azure's `"object":""` and `"created":0` there: a chunk of Tropa's stream like the others.
      return text
        .replace(EMPTY_OBJECT, '"object":"chat.completion.chunk"')
        .replace(ZERO_CREATED, `"created":${Math.floor(Date.now() / 1000)}`)
    }
    // copies, or they would keep the first chunk alive for the whole stream
    this.idFrom = id ? copyOf(id[0]) : ''
    this.modelFrom = model ? sharedString(model[0]) : ''
    return undefined
  }

  /**
   * The event with the first of the upstream's id and model strings swapped for Tropa's, built
   * from slices (a rope, flattened once when the chunk is encoded): two replace() calls copied
   * the event twice. (Nor are `$` patterns read in the ids: config's model ids have none, but the
   * relay does not depend on that.)
   */
  private rewrite(text: string): string {
    const idAt = this.idFrom ? text.indexOf(this.idFrom) : -1
    const modelAt = this.modelFrom ? text.indexOf(this.modelFrom) : -1
    if (idAt < 0 && modelAt < 0) return text
    if (modelAt < 0) return text.slice(0, idAt) + this.idTo + text.slice(idAt + this.idFrom!.length)
    if (idAt < 0) return text.slice(0, modelAt) + this.modelTo + text.slice(modelAt + this.modelFrom!.length)
    const idEnd = idAt + this.idFrom!.length
    const modelEnd = modelAt + this.modelFrom!.length
    return idAt < modelAt
      ? text.slice(0, idAt) + this.idTo + text.slice(idEnd, modelAt) + this.modelTo + text.slice(modelEnd)
      : text.slice(0, modelAt) + this.modelTo + text.slice(modelEnd, idAt) + this.idTo + text.slice(idEnd)
  }
}

// A JSON string holds no raw newline: the pattern stops at one, so that in the events read
// together (joined by newlines) a string an upstream left unterminated ends with its event.
const DELTA_TEXT = /"(?:content|arguments|name)"\s*:\s*"((?:[^"\\\n]|\\.)*)"/g

/** Chat chunks: the text is the delta's content, tool-call names and arguments. */
export const CHAT_STREAM: StreamShape = { object: 'chat.completion.chunk', text: DELTA_TEXT }
/**
 * Legacy completions chunks: the text is each choice's `text` (a logprobs object has no string
 * field of that name: its tokens are array items and object keys).
 */
export const TEXT_COMPLETION_STREAM: StreamShape = {
  object: 'text_completion',
  text: /"text"\s*:\s*"((?:[^"\\\n]|\\.)*)"/g,
}

/**
 * The generated text of one chunk (by default a chat chunk's content, tool-call names and
 * arguments), read with a regex rather than a parse of the whole chunk. `name` can only be a
 * tool's name inside a chunk's delta.
 */
export function deltaText(payload: string, fields: RegExp = DELTA_TEXT): string {
  let text = ''
  for (const m of payload.matchAll(fields)) {
    const raw = m[1]!
    if (raw.length === 0) continue
    try {
      text += raw.includes('\\') ? (JSON.parse(`"${raw}"`) as string) : raw
    } catch {
      text += raw
    }
  }
  return text
}

export function sseEvent(data: unknown): Uint8Array {
  return encoder.encode(`data: ${JSON.stringify(data)}\n\n`)
}

function safeParse(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}
