// Anthropic's answers translated back into OpenAI's form: a message into a chat.completion, and
// the Messages SSE event sequence into chat.completion.chunk events, one Anthropic event at a
// time (nothing is buffered but the current incomplete line, itself bounded).

type Json = Record<string, unknown>

/** Anthropic's stop reasons as OpenAI's finish reasons. */
export function finishReason(stop: unknown): string {
  switch (stop) {
    case 'max_tokens':
    case 'model_context_window_exceeded':
      return 'length'
    case 'tool_use':
      return 'tool_calls'
    case 'refusal':
      return 'content_filter'
    default:
      // end_turn, stop_sequence, pause_turn
      return 'stop'
  }
}

/** Counts as Anthropic reports them (input_tokens excludes the cached and cache-written parts). */
export interface AnthropicUsage {
  input_tokens?: unknown
  output_tokens?: unknown
  cache_read_input_tokens?: unknown
  cache_creation_input_tokens?: unknown
}

/** A count that may be absent (null or missing: 0); anything else not a number: NaN. */
const count = (x: unknown): number =>
  typeof x === 'number' ? x : x === undefined || x === null ? 0 : Number.NaN

/**
 * OpenAI's usage: every input token is a prompt token; the cache reads are its cached ones. Counts
 * that are not numbers stay not numbers, for the pipeline's sanity check to refuse (Tropa then
 * counts itself).
 */
export function openAIUsage(u: AnthropicUsage): Json {
  const cached = count(u.cache_read_input_tokens)
  const input = typeof u.input_tokens === 'number' ? u.input_tokens : Number.NaN
  const prompt = input + cached + count(u.cache_creation_input_tokens)
  const completion = typeof u.output_tokens === 'number' ? u.output_tokens : Number.NaN
  const finite = (x: number) => (Number.isFinite(x) ? x : null)
  return {
    prompt_tokens: finite(prompt),
    completion_tokens: finite(completion),
    total_tokens: finite(prompt + completion),
    prompt_tokens_details: { cached_tokens: Number.isFinite(cached) ? cached : 0 },
  }
}

/** A Messages API message as a chat.completion. */
export function toChatCompletion(m: Json): Json {
  let text = ''
  const toolCalls: Json[] = []
  for (const b of Array.isArray(m.content) ? (m.content as Json[]) : []) {
    if (b.type === 'text' && typeof b.text === 'string') text += b.text
    else if (b.type === 'tool_use')
      toolCalls.push({
        id: b.id,
        type: 'function',
        function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) },
      })
  }
  const message: Json = {
    role: 'assistant',
    content: text.length > 0 || toolCalls.length === 0 ? text : null,
  }
  if (toolCalls.length > 0) message.tool_calls = toolCalls
  return {
    id: m.id,
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model: m.model,
    choices: [{ index: 0, message, logprobs: null, finish_reason: finishReason(m.stop_reason) }],
    ...(m.usage !== null && typeof m.usage === 'object'
      ? { usage: openAIUsage(m.usage as AnthropicUsage) }
      : {}),
  }
}

/** The longest SSE line (an event's data) the translator holds while it is incomplete. */
export const MAX_LINE_BYTES = 1024 * 1024

/**
 * Anthropic's SSE stream in, OpenAI's chunks out. Fed the upstream's bytes as they come; each call
 * returns what to send now. An Anthropic `error` event becomes OpenAI's `data: {"error":...}`
 * (the relay ends the stream on it); message_stop becomes the usage chunk and `[DONE]`.
 */
export class AnthropicStreamTranslator {
  private readonly decoder = new TextDecoder()
  private line = ''
  private head = ''
  private created = Math.floor(Date.now() / 1000)
  private usage: AnthropicUsage = {}
  private stop: unknown
  /** Anthropic's content block index -> OpenAI's tool call index. */
  private readonly tools = new Map<number, number>()
  private done = false

  /** Whether the stream is over (message_stop, an error event, or a malformed stream). */
  get finished(): boolean {
    return this.done
  }

  /** The text to send for these upstream bytes (possibly empty). */
  push(chunk: Uint8Array): string {
    if (this.done) return ''
    const text = this.decoder.decode(chunk, { stream: true })
    let out = ''
    let start = 0
    for (;;) {
      const nl = text.indexOf('\n', start)
      if (nl < 0) break
      const line = this.line.length > 0 ? this.line + text.slice(start, nl) : text.slice(start, nl)
      this.line = ''
      start = nl + 1
      out += this.onLine(line.endsWith('\r') ? line.slice(0, -1) : line)
      if (this.done) return out
    }
    if (start < text.length) {
      this.line += text.slice(start)
      if (this.line.length > MAX_LINE_BYTES) {
        this.done = true
        this.line = ''
        return out + errorEvent('the upstream sent an over-long event', 'upstream_error')
      }
    }
    return out
  }

  /** What is left when the upstream closes. */
  end(): string {
    if (this.done) return ''
    const rest = this.line + this.decoder.decode()
    this.line = ''
    return rest.length > 0 ? this.onLine(rest) : ''
  }

  // Only `data:` lines matter: every Anthropic event's data carries its own `type`.
  private onLine(line: string): string {
    if (!line.startsWith('data:')) return ''
    let e: Json
    try {
      e = JSON.parse(line.slice(5)) as Json
    } catch {
      this.done = true
      return errorEvent('the upstream sent a malformed event', 'upstream_error')
    }
    if (!e || typeof e !== 'object') return ''
    switch (e.type) {
      case 'message_start': {
        const m = (e.message ?? {}) as Json
        this.head = `{"id":${JSON.stringify(String(m.id ?? 'msg'))},"object":"chat.completion.chunk","created":${this.created},"model":${JSON.stringify(String(m.model ?? ''))},"choices":[`
        if (m.usage && typeof m.usage === 'object') this.usage = { ...(m.usage as AnthropicUsage) }
        return this.chunk('{"role":"assistant","content":""}', null)
      }
      case 'content_block_start': {
        const b = (e.content_block ?? {}) as Json
        if (b.type === 'tool_use') {
          const index = this.tools.size
          this.tools.set(e.index as number, index)
          return this.chunk(
            `{"tool_calls":[{"index":${index},"id":${JSON.stringify(String(b.id ?? ''))},"type":"function","function":{"name":${JSON.stringify(String(b.name ?? ''))},"arguments":""}}]}`,
            null,
          )
        }
        if (b.type === 'text' && typeof b.text === 'string' && b.text.length > 0)
          return this.chunk(`{"content":${JSON.stringify(b.text)}}`, null)
        return ''
      }
      case 'content_block_delta': {
        const d = (e.delta ?? {}) as Json
        if (d.type === 'text_delta' && typeof d.text === 'string')
          return this.chunk(`{"content":${JSON.stringify(d.text)}}`, null)
        if (d.type === 'input_json_delta' && typeof d.partial_json === 'string') {
          const index = this.tools.get(e.index as number)
          if (index === undefined || d.partial_json.length === 0) return ''
          return this.chunk(
            `{"tool_calls":[{"index":${index},"function":{"arguments":${JSON.stringify(d.partial_json)}}}]}`,
            null,
          )
        }
        return '' // thinking and signature deltas: not part of OpenAI's chat answer
      }
      case 'message_delta': {
        const d = (e.delta ?? {}) as Json
        // Cumulative totals: what is present replaces what message_start said.
        const u = (e.usage ?? {}) as AnthropicUsage
        for (const k of [
          'input_tokens',
          'output_tokens',
          'cache_read_input_tokens',
          'cache_creation_input_tokens',
        ] as const)
          if (u[k] !== undefined && u[k] !== null) this.usage[k] = u[k]
        this.stop = d.stop_reason
        return ''
      }
      case 'message_stop':
        this.done = true
        if (this.head.length === 0) return errorEvent('the upstream sent no message_start', 'upstream_error')
        return `${this.chunk('{}', finishReason(this.stop))}data: ${this.head}],"usage":${JSON.stringify(openAIUsage(this.usage))}}\n\ndata: [DONE]\n\n`
      case 'error': {
        this.done = true
        const err = (e.error ?? {}) as Json
        return errorEvent(
          typeof err.message === 'string' ? err.message.slice(0, 300) : 'upstream error',
          typeof err.type === 'string' ? err.type : 'upstream_error',
        )
      }
      default:
        return '' // ping, and event types added later
    }
  }

  private chunk(delta: string, finish: string | null): string {
    if (this.head.length === 0) return '' // nothing before message_start
    return `data: ${this.head}{"index":0,"delta":${delta},"logprobs":null,"finish_reason":${finish === null ? 'null' : `"${finish}"`}}]}\n\n`
  }
}

function errorEvent(message: string, code: string): string {
  return `data: ${JSON.stringify({ error: { message, type: 'upstream_error', param: null, code } })}\n\n`
}
