import { renderPrompt } from '../render.ts'
import type { ProtocolFront } from './front.ts'

// Anthropic's Messages API (POST /v1/messages) as its public reference describes it: the
// `x-api-key` and `anthropic-version` headers, `max_tokens` required, `system` apart from the
// messages, content blocks (text, image, tool_use, tool_result), `stop_sequences`, the message
// object with its usage (input_tokens without the cache reads, cache_read_input_tokens,
// cache_creation_input_tokens, output_tokens), the SSE event sequence (message_start,
// content_block_start, ping, content_block_delta with text_delta or input_json_delta,
// content_block_stop, message_delta with the stop reason and cumulative usage, message_stop) and
// the error body {"type":"error","error":{type,message}}. The node's OpenAI engine answers; this
// front translates. Checked with @anthropic-ai/sdk in test/providers/anthropic-sim.test.ts.

/** The one key the simulated Anthropic API accepts (as `x-api-key`, or `Authorization: Bearer`). */
export const ANTHROPIC_SIM_KEY = 'sk-ant-sim-key-0123456789'
/** The API versions: 2026-10-21 removed temperature, top_p and top_k (a 400 if sent). */
const VERSIONS = new Set(['2023-06-01', '2026-10-21'])

type Json = Record<string, unknown>

const encoder = new TextEncoder()
let seq = 0
const nextId = (prefix: string) => `${prefix}_sim${(++seq).toString(36).padStart(8, '0')}`

function anthropicError(status: number, type: string, message: string): Response {
  return Response.json(
    { type: 'error', error: { type, message }, request_id: nextId('req') },
    { status, headers: { 'request-id': nextId('req') } },
  )
}
const invalid = (message: string) => anthropicError(400, 'invalid_request_error', message)

/** Anthropic's error type for a status (529 is its "overloaded"). */
function errorType(status: number): string {
  if (status === 400) return 'invalid_request_error'
  if (status === 401) return 'authentication_error'
  if (status === 403) return 'permission_error'
  if (status === 404) return 'not_found_error'
  if (status === 413) return 'request_too_large'
  if (status === 429) return 'rate_limit_error'
  if (status === 529) return 'overloaded_error'
  return 'api_error'
}

/** The node's own error response (a fault, or its engine refusing) in Anthropic's shape. */
async function translateError(res: Response): Promise<Response> {
  let message = `error ${res.status}`
  try {
    const body = (await res.json()) as { error?: { message?: string } }
    if (typeof body.error?.message === 'string') message = body.error.message
  } catch {
    // the status says enough
  }
  const status = res.status === 503 ? 529 : res.status
  return anthropicError(status, errorType(status), message)
}

export const anthropicFront: ProtocolFront = async (req, core) => {
  const path = new URL(req.url).pathname
  if (req.method === 'GET' && path === '/health') return new Response('ok')
  if (path !== '/v1/messages') return anthropicError(404, 'not_found_error', `Not found: ${path}`)
  if (req.method !== 'POST') return anthropicError(405, 'invalid_request_error', 'Method not allowed')
  // The key comes as x-api-key (API version 2023-06-01 clients) or as a Bearer token (the SDKs
  // since API version 2026-10-21).
  const bearer = /^Bearer\s+(.+)$/i.exec(req.headers.get('authorization') ?? '')?.[1]
  const key = req.headers.get('x-api-key') ?? bearer
  if (key !== ANTHROPIC_SIM_KEY) return anthropicError(401, 'authentication_error', 'invalid x-api-key')
  const version = req.headers.get('anthropic-version')
  if (!version) return invalid('anthropic-version: header is required')
  if (!VERSIONS.has(version))
    return invalid(`anthropic-version: ${JSON.stringify(version.slice(0, 40))} is not a valid version`)
  const fault = core.fault()
  if (fault) return translateError(fault)
  let body: Json
  try {
    body = (await req.json()) as Json
  } catch {
    return invalid('There was an issue with the JSON body of your request')
  }
  if (!body || typeof body !== 'object' || Array.isArray(body))
    return invalid('body: Input should be an object')
  const problem = check(body, version)
  if (problem) return invalid(problem)
  let openai: Json
  try {
    openai = toOpenAI(body)
  } catch (err) {
    return invalid((err as Error).message)
  }
  const stream = body.stream === true
  const stops = (Array.isArray(body.stop_sequences) ? body.stop_sequences : []) as string[]
  const halt = new AbortController()
  const onAbort = () => halt.abort()
  req.signal.addEventListener('abort', onAbort, { once: true })
  const res = await core.chat(
    { ...openai, stream: true, stream_options: { include_usage: true } },
    halt.signal,
  )
  if (!res.ok) return translateError(res)
  const promptTokens = renderPrompt(openai.messages as Json[]).count
  const gen = new Generation(res.body!, stops, () => halt.abort(), promptTokens)
  const model = body.model as string
  const id = nextId('msg')
  return stream ? streamed(gen, id, model) : whole(gen, id, model)
}

/** The Messages API's checks of a request, with its wording; undefined when it is acceptable. */
function check(b: Json, version: string): string | undefined {
  if (typeof b.model !== 'string' || b.model.length === 0) return 'model: Field required'
  if (b.max_tokens === undefined) return 'max_tokens: Field required'
  if (!Number.isInteger(b.max_tokens) || (b.max_tokens as number) < 1)
    return 'max_tokens: Input should be a valid integer greater than or equal to 1'
  if (!Array.isArray(b.messages) || b.messages.length === 0)
    return 'messages: at least one message is required'
  for (const [i, m] of (b.messages as Json[]).entries()) {
    if (!m || typeof m !== 'object') return `messages.${i}: Input should be an object`
    if (m.role !== 'user' && m.role !== 'assistant')
      return `messages.${i}.role: Unexpected role ${JSON.stringify(m.role)}. The Messages API accepts a top-level \`system\` parameter, not "system" as an input message role.`
    if (typeof m.content !== 'string' && !Array.isArray(m.content))
      return `messages.${i}.content: Input should be a valid string or list`
    if (Array.isArray(m.content))
      for (const [k, blk] of (m.content as Json[]).entries())
        if (blk?.type === 'text' && (typeof blk.text !== 'string' || blk.text.length === 0))
          return `messages.${i}.content.${k}.text: text content blocks must be non-empty`
  }
  if (version >= '2026-10-21')
    for (const k of ['temperature', 'top_p', 'top_k'])
      if (b[k] !== undefined) return `${k}: this parameter is not supported in API version ${version}`
  if (
    b.temperature !== undefined &&
    (typeof b.temperature !== 'number' || b.temperature < 0 || b.temperature > 1)
  )
    return 'temperature: Input should be less than or equal to 1'
  if (b.stop_sequences !== undefined)
    if (
      !Array.isArray(b.stop_sequences) ||
      b.stop_sequences.some((s) => typeof s !== 'string' || s.trim() === '')
    )
      return 'stop_sequences: each stop sequence must be a non-empty string with non-whitespace'
  if (b.system !== undefined && typeof b.system !== 'string' && !Array.isArray(b.system))
    return 'system: Input should be a valid string or list'
  return undefined
}

/** The request in the node's OpenAI form. */
function toOpenAI(b: Json): Json {
  const messages: Json[] = []
  if (typeof b.system === 'string') messages.push({ role: 'system', content: b.system })
  else if (Array.isArray(b.system))
    messages.push({
      role: 'system',
      content: (b.system as Json[]).map((t) => String(t.text ?? '')).join('\n'),
    })
  for (const m of b.messages as Json[]) {
    const blocks: Json[] =
      typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : (m.content as Json[])
    if (m.role === 'assistant') {
      const text = blocks
        .filter((x) => x.type === 'text')
        .map((x) => x.text)
        .join('')
      const calls = blocks
        .filter((x) => x.type === 'tool_use')
        .map((x) => ({
          id: x.id,
          type: 'function',
          function: { name: x.name, arguments: JSON.stringify(x.input ?? {}) },
        }))
      messages.push({ role: 'assistant', content: text, ...(calls.length > 0 && { tool_calls: calls }) })
      continue
    }
    const parts: Json[] = []
    for (const x of blocks) {
      if (x.type === 'tool_result') {
        const c = x.content
        const text =
          typeof c === 'string' ? c : Array.isArray(c) ? (c as Json[]).map((p) => p.text ?? '').join('') : ''
        messages.push({ role: 'tool', tool_call_id: x.tool_use_id, content: text })
      } else if (x.type === 'text') parts.push({ type: 'text', text: x.text })
      else if (x.type === 'image') {
        const s = (x.source ?? {}) as Json
        if (s.type === 'base64' && typeof s.data === 'string' && typeof s.media_type === 'string')
          parts.push({ type: 'image_url', image_url: { url: `data:${s.media_type};base64,${s.data}` } })
        else if (s.type === 'url' && typeof s.url === 'string')
          parts.push({ type: 'image_url', image_url: { url: s.url } })
        else throw new Error('image.source: Input should be a base64 or url source')
      } else if (x.type === 'document') parts.push({ type: 'text', text: '[document]' })
      else
        throw new Error(
          `Input tag ${JSON.stringify(x.type)} found using 'type' does not match any of the expected tags`,
        )
    }
    if (parts.length > 0) messages.push({ role: 'user', content: parts })
  }
  const out: Json = { model: b.model, messages, max_tokens: b.max_tokens }
  const tools = Array.isArray(b.tools) ? (b.tools as Json[]) : []
  if (tools.length > 0) {
    out.tools = tools.map((t) => ({
      type: 'function',
      function: { name: t.name, description: t.description, parameters: t.input_schema },
    }))
    const choice = (b.tool_choice ?? { type: 'auto' }) as Json
    out.tool_choice =
      choice.type === 'any'
        ? 'required'
        : choice.type === 'none'
          ? 'none'
          : choice.type === 'tool'
            ? { type: 'function', function: { name: choice.name } }
            : 'auto'
  }
  return out
}

interface Piece {
  text?: string
  tool?: { id?: string; name?: string; args: string }
}

/**
 * The node's OpenAI stream read as generation events: text pieces, tool call pieces, and at the
 * end the finish reason and usage. Applies stop_sequences (the engine has none): the text stops
 * before the first one, and the engine is told to stop.
 */
class Generation {
  private readonly reader: ReadableStreamDefaultReader<Uint8Array>
  private readonly decoder = new TextDecoder()
  /** The node's stream is read as it comes (what it sent before a cut is kept): its text. */
  private readonly received: string[] = []
  private ended = false
  private failure: unknown
  private wake: (() => void) | undefined
  private buffer = ''
  private text = ''
  private over = false
  outputTokens = 0
  cachedTokens = 0
  finish: string | null = null
  stopSequence: string | null = null

  constructor(
    body: ReadableStream<Uint8Array>,
    private readonly stops: readonly string[],
    private readonly halt: () => void,
    /** The prompt's tokens as the node counts them (its usage event says so again at the end). */
    public promptTokens: number,
  ) {
    this.reader = body.getReader()
    void this.pump()
  }

  private async pump(): Promise<void> {
    try {
      for (;;) {
        const { done, value } = await this.reader.read()
        if (done) break
        this.received.push(this.decoder.decode(value, { stream: true }))
        this.wake?.()
      }
    } catch (err) {
      this.failure = err ?? new Error('the node broke its stream')
    }
    this.ended = true
    this.wake?.()
  }

  /** The node's next text; undefined at its end; throws (after what came before) if it broke. */
  private async take(): Promise<string | undefined> {
    while (this.received.length === 0) {
      if (this.ended) {
        if (this.failure !== undefined) throw this.failure
        return undefined
      }
      await new Promise<void>((resolve) => {
        this.wake = resolve
      })
    }
    return this.received.shift()
  }

  /** The next pieces (never empty); undefined at the end. Throws when the node broke. */
  async next(): Promise<Piece[] | undefined> {
    while (!this.over) {
      const value = await this.take()
      if (value === undefined) {
        this.over = true
        if (this.finish === null) throw new Error('the node ended its stream early')
        return undefined
      }
      this.buffer += value
      const pieces: Piece[] = []
      let end = this.buffer.indexOf('\n\n')
      while (end >= 0) {
        const event = this.buffer.slice(0, end)
        this.buffer = this.buffer.slice(end + 2)
        this.onEvent(event, pieces)
        if (this.stopSequence !== null) {
          this.over = true
          this.cancel()
          return pieces
        }
        end = this.buffer.indexOf('\n\n')
      }
      if (pieces.length > 0) return pieces
    }
    return undefined
  }

  cancel(): void {
    this.halt()
    this.reader.cancel().catch(() => {})
  }

  private onEvent(event: string, pieces: Piece[]) {
    if (!event.startsWith('data: ') || event === 'data: [DONE]') return
    const chunk = JSON.parse(event.slice(6)) as {
      choices: { delta?: Json; finish_reason?: string | null }[]
      usage?: {
        prompt_tokens: number
        completion_tokens: number
        prompt_tokens_details?: { cached_tokens?: number }
      }
    }
    if (chunk.usage) {
      this.promptTokens = chunk.usage.prompt_tokens
      this.cachedTokens = chunk.usage.prompt_tokens_details?.cached_tokens ?? 0
      this.outputTokens = chunk.usage.completion_tokens
    }
    const choice = chunk.choices[0]
    if (!choice) return
    if (choice.finish_reason) this.finish = choice.finish_reason
    const delta = choice.delta ?? {}
    if (typeof delta.content === 'string' && delta.content.length > 0) {
      this.outputTokens++
      const before = this.text.length
      this.text += delta.content
      // The earliest stop sequence in the text, looking only where this piece could complete one.
      let at = -1
      for (const s of this.stops) {
        const i = this.text.indexOf(s, Math.max(0, before - s.length + 1))
        if (i >= 0 && (at < 0 || i < at)) {
          at = i
          this.stopSequence = s
        }
      }
      if (at >= 0) {
        this.finish = 'stop_sequence'
        const kept = this.text.slice(before, Math.max(before, at))
        if (kept.length > 0) pieces.push({ text: kept })
        return
      }
      pieces.push({ text: delta.content })
    }
    const calls = delta.tool_calls as
      | { id?: string; function?: { name?: string; arguments?: string } }[]
      | undefined
    if (calls?.[0]) {
      this.outputTokens++
      const c = calls[0]
      pieces.push({
        tool: {
          ...(c.id !== undefined && { id: c.id.replace(/^call_/, 'toolu_') }),
          ...(c.function?.name !== undefined && { name: c.function.name }),
          args: c.function?.arguments ?? '',
        },
      })
    }
  }

  stopReason(): string {
    if (this.finish === 'stop_sequence') return 'stop_sequence'
    if (this.finish === 'length') return 'max_tokens'
    if (this.finish === 'tool_calls') return 'tool_use'
    return 'end_turn'
  }

  usage(): Json {
    return {
      input_tokens: this.promptTokens - this.cachedTokens,
      cache_creation_input_tokens: 0,
      cache_read_input_tokens: this.cachedTokens,
      output_tokens: this.outputTokens,
    }
  }
}

/** A non-streamed message: the whole generation, then one JSON body. */
async function whole(gen: Generation, id: string, model: string): Promise<Response> {
  let text = ''
  let tool: { id: string; name: string; args: string } | undefined
  try {
    for (;;) {
      const pieces = await gen.next()
      if (!pieces) break
      for (const p of pieces) {
        if (p.text !== undefined) text += p.text
        if (p.tool) {
          tool ??= { id: p.tool.id ?? nextId('toolu'), name: p.tool.name ?? 'tool', args: '' }
          tool.args += p.tool.args
        }
      }
    }
  } catch {
    // The node broke (a cut fault): the connection dies with no complete response.
    return new Response(
      new ReadableStream({
        start(c) {
          c.enqueue(encoder.encode('{"id":'))
          c.error(new Error('simulated cut'))
        },
      }),
      { headers: { 'content-type': 'application/json' } },
    )
  }
  const content: Json[] = []
  const trimmed = text.trimStart()
  if (trimmed.length > 0 || !tool) content.push({ type: 'text', text: trimmed })
  if (tool)
    content.push({ type: 'tool_use', id: tool.id, name: tool.name, input: JSON.parse(tool.args || '{}') })
  return Response.json({
    id,
    type: 'message',
    role: 'assistant',
    model,
    content,
    stop_reason: gen.stopReason(),
    stop_sequence: gen.stopSequence,
    usage: gen.usage(),
  })
}

const sse = (type: string, data: Json) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`

/** A streamed message: Anthropic's event sequence, as the node generates. */
function streamed(gen: Generation, id: string, model: string): Response {
  let started = false
  let block = -1
  let kind: 'text' | 'tool' | undefined
  let pinged = false
  let firstText = true
  const body = new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let out = ''
        if (!started) {
          started = true
          out += sse('message_start', {
            message: {
              id,
              type: 'message',
              role: 'assistant',
              model,
              content: [],
              stop_reason: null,
              stop_sequence: null,
              usage: {
                input_tokens: gen.promptTokens,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
                output_tokens: 1,
              },
            },
          })
        }
        const pieces = await gen.next()
        if (!pieces) {
          if (block >= 0) out += sse('content_block_stop', { index: block })
          // Cumulative usage: the cache reads are known by now.
          out += sse('message_delta', {
            delta: { stop_reason: gen.stopReason(), stop_sequence: gen.stopSequence },
            usage: gen.usage(),
          })
          out += sse('message_stop', {})
          controller.enqueue(encoder.encode(out))
          controller.close()
          return
        }
        for (const p of pieces) {
          const want = p.tool ? 'tool' : 'text'
          if (want !== kind || p.tool?.id !== undefined) {
            if (block >= 0) out += sse('content_block_stop', { index: block })
            block++
            kind = want
            out += sse('content_block_start', {
              index: block,
              content_block: p.tool
                ? {
                    type: 'tool_use',
                    id: p.tool.id ?? nextId('toolu'),
                    name: p.tool.name ?? 'tool',
                    input: {},
                  }
                : { type: 'text', text: '' },
            })
            if (!pinged) {
              pinged = true
              out += sse('ping', {})
            }
          }
          let text = p.tool ? p.tool.args : p.text!
          if (!p.tool && firstText) {
            firstText = false
            text = text.trimStart()
          }
          if (text.length === 0) continue
          out += sse('content_block_delta', {
            index: block,
            delta: p.tool ? { type: 'input_json_delta', partial_json: text } : { type: 'text_delta', text },
          })
        }
        controller.enqueue(encoder.encode(out))
      },
      cancel() {
        gen.cancel()
      },
      // Pulled only when the socket wants more: what was sent before a cut has left the node.
    },
    { highWaterMark: 0 },
  )
  return new Response(body, {
    headers: {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      'request-id': nextId('req'),
    },
  })
}
