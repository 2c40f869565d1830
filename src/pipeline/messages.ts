import type { Static } from '@sinclair/typebox'
import type { ChatMessage, ChatRequest, ContentPart } from '../api/chat.ts'
import type { CountTokensRequest, MessagesRequest, MsgContentBlock, MsgCustomTool } from '../api/messages.ts'
import { InvalidValue } from '../errors.ts'
import type { RequestTrace } from '../tracing/span.ts'
import type { Usage } from '../upstream/sse.ts'
import { type ChatDeps, chatCompletion, type Payer } from './chat.ts'
import { countChatPromptLive, loadTokenizer } from './tokens.ts'

/**
 * The Anthropic Messages API (POST /v1/messages) as a thin front end over chat's lifecycle:
 * translate the request into Tropa's OpenAI chat form, run `chatCompletion` unchanged (count,
 * reserve, route with failover, relay, settle: billing is chat's), translate its answer (JSON, or
 * the SSE stream chunk by chunk) into Anthropic's message object or event sequence.
 */
export async function createMessage(
  deps: ChatDeps,
  payer: Payer,
  body: MessagesRequest,
  signal: AbortSignal,
  requestId: string,
  sessionHint?: string,
  cut?: () => void,
  trace?: RequestTrace,
): Promise<Response> {
  const chat = toChatRequest(body)
  const res = await chatCompletion(deps, payer, chat, signal, requestId, sessionHint, cut, trace)
  if (payer.quoteOnly) return res // a quote is the same object whatever the inbound API
  const headers = new Headers(res.headers)
  const id = `msg_${requestId}`
  const stops = body.stop_sequences
  if (!chat.stream) {
    const completion = (await res.json()) as OpenAICompletion
    headers.set('content-type', 'application/json')
    return new Response(JSON.stringify(toMessage(id, completion, stops)), { status: 200, headers })
  }
  // chatCompletion answers a stream only once its first chunk arrived: the body is non-null.
  const events = res.body!.pipeThrough(new MessageEvents(id, body.model, stops))
  return new Response(events, { status: 200, headers })
}

/** POST /v1/messages/count_tokens: the prompt counted as chat counts it (o200k, with framing). */
export async function countMessageTokens(
  deps: Pick<ChatDeps, 'catalogue'>,
  body: CountTokensRequest,
): Promise<{ input_tokens: number }> {
  deps.catalogue.getOfKind(body.model, 'chat')
  const chat = toChatRequest({ ...body, max_tokens: 1 })
  await loadTokenizer()
  const n = countChatPromptLive(chat.messages, chat.tools, Number.POSITIVE_INFINITY)
  return { input_tokens: typeof n === 'number' ? n : await n }
}

// ---------------------------------------------------------------- request: Anthropic -> OpenAI

/** The OpenAI chat request an Anthropic Messages request means (fields it cannot say dropped). */
export function toChatRequest(body: MessagesRequest): ChatRequest {
  const messages: ChatMessage[] = []
  if (body.system !== undefined) {
    const text = typeof body.system === 'string' ? body.system : body.system.map((b) => b.text).join('\n')
    if (text.length > 0) messages.push({ role: 'system', content: text })
  }
  body.messages.forEach((m, i) => {
    if (typeof m.content === 'string') messages.push({ role: m.role, content: m.content })
    else if (m.role === 'user') userMessages(m.content, `messages[${i}]`, messages)
    else messages.push(assistantMessage(m.content, `messages[${i}]`))
  })
  if (!messages.some((m) => m.role !== 'system'))
    throw new InvalidValue('messages: no text, image, tool_use or tool_result block to send', 'messages')
  const chat: ChatRequest = { model: body.model, messages, max_tokens: body.max_tokens }
  if (body.stream === true) {
    chat.stream = true
    // The final usage chunk carries what was billed: message_delta reports it.
    chat.stream_options = { include_usage: true }
  }
  if (body.temperature !== undefined) chat.temperature = body.temperature
  if (body.top_p !== undefined) chat.top_p = body.top_p
  if (body.stop_sequences !== undefined && body.stop_sequences.length > 0) chat.stop = body.stop_sequences
  if (typeof body.metadata?.user_id === 'string') chat.user = body.metadata.user_id
  const tools = customTools(body.tools)
  if (tools.length > 0) {
    chat.tools = tools.map((t) => ({
      type: 'function' as const,
      function: {
        name: t.name,
        ...(t.description !== undefined && { description: t.description }),
        parameters: t.input_schema,
      },
    }))
  }
  const choice = body.tool_choice
  if (choice !== undefined) {
    if (choice.type === 'none') chat.tool_choice = 'none'
    else if (chat.tools !== undefined) {
      chat.tool_choice =
        choice.type === 'auto'
          ? 'auto'
          : choice.type === 'any'
            ? 'required'
            : { type: 'function', function: { name: choice.name } }
      if (choice.disable_parallel_tool_use === true)
        (chat as ChatRequest & { parallel_tool_calls?: boolean }).parallel_tool_calls = false
    } else if (choice.type !== 'auto')
      throw new InvalidValue(`tool_choice ${JSON.stringify(choice.type)} needs tools`, 'tool_choice')
  }
  return chat
}

/** The client's own tools; Anthropic's server tools are dropped (no model behind Tropa runs them). */
function customTools(tools: MessagesRequest['tools']): Static<typeof MsgCustomTool>[] {
  const out: Static<typeof MsgCustomTool>[] = []
  tools?.forEach((t, i) => {
    if ('input_schema' in t && t.input_schema !== undefined) out.push(t as Static<typeof MsgCustomTool>)
    else if (t.type === undefined || t.type === 'custom')
      throw new InvalidValue(`tools[${i}]: a custom tool needs input_schema`, `tools[${i}].input_schema`)
  })
  return out
}

const imageUrl = (b: Extract<MsgContentBlock, { type: 'image' }>): string =>
  b.source.type === 'base64' ? `data:${b.source.media_type};base64,${b.source.data}` : b.source.url

/**
 * A user turn: its tool results become tool messages (first: OpenAI wants them right after the
 * assistant's tool calls), the rest one user message of text and image parts.
 */
function userMessages(blocks: readonly MsgContentBlock[], at: string, out: ChatMessage[]): void {
  const parts: ContentPart[] = []
  blocks.forEach((b, j) => {
    switch (b.type) {
      case 'text':
        parts.push({ type: 'text', text: b.text })
        break
      case 'image':
        parts.push({ type: 'image_url', image_url: { url: imageUrl(b) } })
        break
      case 'tool_result': {
        let content = ''
        if (typeof b.content === 'string') content = b.content
        else if (b.content !== undefined)
          for (const [k, c] of b.content.entries()) {
            if (c.type !== 'text')
              throw new InvalidValue(
                `${at}.content[${j}]: images inside a tool_result are not supported; send them in a user text/image block`,
                `${at}.content[${j}].content[${k}]`,
              )
            content += content.length > 0 ? `\n${c.text}` : c.text
          }
        out.push({ role: 'tool', tool_call_id: b.tool_use_id, content })
        break
      }
      case 'tool_use':
        throw new InvalidValue(
          `${at}.content[${j}]: tool_use blocks belong to assistant messages`,
          `${at}.content[${j}]`,
        )
      default:
        // thinking blocks are the model's: dropped
        break
    }
  })
  if (parts.length > 0) out.push({ role: 'user', content: parts })
}

/** An assistant turn: its text, and its tool_use blocks as tool_calls. */
function assistantMessage(blocks: readonly MsgContentBlock[], at: string): ChatMessage {
  let text = ''
  const calls: NonNullable<ChatMessage['tool_calls']> = []
  blocks.forEach((b, j) => {
    switch (b.type) {
      case 'text':
        text += b.text
        break
      case 'tool_use':
        calls.push({
          id: b.id,
          type: 'function',
          function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) },
        })
        break
      case 'image':
      case 'tool_result':
        throw new InvalidValue(
          `${at}.content[${j}]: ${b.type} blocks belong to user messages`,
          `${at}.content[${j}]`,
        )
      default:
        break
    }
  })
  const m: ChatMessage = { role: 'assistant', content: text.length > 0 || calls.length === 0 ? text : null }
  if (calls.length > 0) m.tool_calls = calls
  return m
}

// ---------------------------------------------------------------- answer: OpenAI -> Anthropic

interface OpenAIToolCall {
  index?: number
  id?: string
  function?: { name?: string; arguments?: string }
}
interface OpenAIChoice {
  message?: { content?: string | null; tool_calls?: OpenAIToolCall[] }
  delta?: { content?: string | null; tool_calls?: OpenAIToolCall[] }
  finish_reason?: string | null
  /** vLLM's: the stop string that ended the answer. */
  stop_reason?: unknown
}
interface OpenAICompletion {
  choices?: OpenAIChoice[]
  usage?: Usage | null
}

type StopReason = 'end_turn' | 'max_tokens' | 'stop_sequence' | 'tool_use' | 'refusal'

/**
 * Anthropic's stop_reason for an OpenAI finish_reason. OpenAI says `stop` for a natural end and
 * a stop sequence alike; a stop sequence is told only when the upstream names the string it
 * stopped at (vLLM's `stop_reason`).
 */
function stopOf(
  choice: OpenAIChoice | undefined,
  stops: readonly string[] | undefined,
): { stop_reason: StopReason; stop_sequence: string | null } {
  switch (choice?.finish_reason) {
    case 'length':
      return { stop_reason: 'max_tokens', stop_sequence: null }
    case 'tool_calls':
    case 'function_call':
      return { stop_reason: 'tool_use', stop_sequence: null }
    case 'content_filter':
      return { stop_reason: 'refusal', stop_sequence: null }
  }
  const s = choice?.stop_reason
  if (typeof s === 'string' && stops?.includes(s)) return { stop_reason: 'stop_sequence', stop_sequence: s }
  return { stop_reason: 'end_turn', stop_sequence: null }
}

/** Anthropic's usage for an OpenAI one: input_tokens excludes the cache reads, as Anthropic's does. */
function usageOf(u: Usage | null | undefined): Record<string, number | string> {
  const prompt = u?.prompt_tokens ?? 0
  const cached = Math.min(prompt, u?.prompt_tokens_details?.cached_tokens ?? 0)
  const out: Record<string, number | string> = {
    input_tokens: prompt - cached,
    output_tokens: u?.completion_tokens ?? 0,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: cached,
  }
  // Tropa's: what the request was charged, roubles (as chat's usage.cost_rub).
  if (typeof u?.cost_rub === 'number') out.cost_rub = u.cost_rub
  // And its signed receipt (docs/api.md, "Receipts").
  if (typeof u?.receipt === 'string') out.receipt = u.receipt
  return out
}

function parseInput(args: string | undefined): unknown {
  if (!args) return {}
  try {
    return JSON.parse(args)
  } catch {
    // A model's malformed arguments: handed over as text rather than lost.
    return { _raw: args }
  }
}

function toMessage(
  id: string,
  c: OpenAICompletion & { model?: unknown },
  stops: readonly string[] | undefined,
) {
  const choice = c.choices?.[0]
  const content: Record<string, unknown>[] = []
  const text = choice?.message?.content
  if (typeof text === 'string' && text.length > 0) content.push({ type: 'text', text })
  for (const call of choice?.message?.tool_calls ?? [])
    content.push({
      type: 'tool_use',
      id: call.id ?? '',
      name: call.function?.name ?? '',
      input: parseInput(call.function?.arguments),
    })
  return {
    id,
    type: 'message',
    role: 'assistant',
    model: c.model,
    content,
    ...stopOf(choice, stops),
    usage: usageOf(c.usage),
  }
}

/** One event held at most this long (a chunk without its blank line): longer fails the stream. */
export const MAX_EVENT_BYTES = 1 << 20

const encoder = new TextEncoder()
const sse = (type: string, data: Record<string, unknown>) =>
  `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`

/**
 * Tropa's OpenAI chat SSE (as chat's relay writes it) into Anthropic's event sequence:
 * message_start, ping, per block content_block_start / _delta (text_delta, input_json_delta) /
 * _stop, then message_delta (stop_reason, the billed usage) and message_stop; an error event as
 * Anthropic's `error` event. Event by event: it holds at most one incomplete event
 * (MAX_EVENT_BYTES), and being a TransformStream it reads its source only as its reader reads it,
 * so the relay's backpressure (and its stalled-client cut) holds.
 */
export class MessageEvents extends TransformStream<Uint8Array, Uint8Array> {
  constructor(id: string, model: string, stops: readonly string[] | undefined) {
    const decoder = new TextDecoder()
    let buffer = ''
    /** The open block: its index, and for a tool call the OpenAI tool call index it is. */
    let block = -1
    let blockKind: 'text' | 'tool' | undefined
    let toolIndex = -1
    let lastChoice: OpenAIChoice | undefined
    let usage: Usage | undefined
    let ended = false
    let out = ''

    const closeBlock = () => {
      if (blockKind === undefined) return
      out += sse('content_block_stop', { index: block })
      blockKind = undefined
    }
    const fail = (message: string, type = 'api_error') => {
      closeBlock()
      out += sse('error', { error: { type, message } })
      ended = true
    }
    const onChoice = (ch: OpenAIChoice) => {
      const d = ch.delta
      const text = d?.content
      if (typeof text === 'string' && text.length > 0) {
        if (blockKind !== 'text') {
          closeBlock()
          block++
          blockKind = 'text'
          out += sse('content_block_start', { index: block, content_block: { type: 'text', text: '' } })
        }
        out += sse('content_block_delta', { index: block, delta: { type: 'text_delta', text } })
      }
      for (const call of d?.tool_calls ?? []) {
        const k = call.index ?? 0
        if (blockKind !== 'tool' || k !== toolIndex) {
          closeBlock()
          block++
          blockKind = 'tool'
          toolIndex = k
          out += sse('content_block_start', {
            index: block,
            content_block: {
              type: 'tool_use',
              id: call.id ?? '',
              name: call.function?.name ?? '',
              input: {},
            },
          })
        }
        const args = call.function?.arguments
        if (args)
          out += sse('content_block_delta', {
            index: block,
            delta: { type: 'input_json_delta', partial_json: args },
          })
      }
      if (ch.finish_reason) lastChoice = ch
    }
    const onEvent = (event: string) => {
      // Chat's keep-alive comment (no first token yet): Anthropic's own keep-alive is a ping.
      if (event.startsWith(':')) {
        out += sse('ping', {})
        return
      }
      for (const line of event.split('\n')) {
        if (!line.startsWith('data:')) continue
        const payload = line.slice(line.charCodeAt(5) === 32 ? 6 : 5).trim()
        if (payload === '[DONE]') {
          closeBlock()
          out += sse('message_delta', { delta: stopOf(lastChoice, stops), usage: usageOf(usage) })
          out += sse('message_stop', {})
          ended = true
          return
        }
        let chunk: {
          choices?: OpenAIChoice[]
          usage?: Usage | null
          error?: { message?: unknown; code?: unknown }
        }
        try {
          chunk = JSON.parse(payload)
        } catch {
          return fail('the upstream sent a malformed chunk')
        }
        if (chunk.error) {
          const e = chunk.error
          return fail(
            typeof e.message === 'string' ? e.message : 'the upstream failed mid-stream',
            e.code === 'upstream_timeout' ? 'timeout_error' : 'api_error',
          )
        }
        if (chunk.usage) usage = chunk.usage
        const ch = chunk.choices?.[0]
        if (ch) onChoice(ch)
      }
    }
    const flushOut = (controller: TransformStreamDefaultController<Uint8Array>) => {
      if (out.length > 0) controller.enqueue(encoder.encode(out))
      out = ''
    }
    super({
      start(controller) {
        out += sse('message_start', {
          message: {
            id,
            type: 'message',
            role: 'assistant',
            model,
            content: [],
            stop_reason: null,
            stop_sequence: null,
            // The billed counts come with message_delta (an OpenAI stream gives them at its end).
            usage: {
              input_tokens: 0,
              output_tokens: 0,
              cache_creation_input_tokens: 0,
              cache_read_input_tokens: 0,
            },
          },
        })
        out += sse('ping', {})
        flushOut(controller)
      },
      transform(chunk, controller) {
        if (ended) return
        buffer += decoder.decode(chunk, { stream: true })
        let start = 0
        for (;;) {
          const end = buffer.indexOf('\n\n', start)
          if (end < 0) break
          onEvent(buffer.slice(start, end))
          start = end + 2
          if (ended) break
        }
        buffer = ended ? '' : buffer.slice(start)
        if (buffer.length > MAX_EVENT_BYTES) {
          buffer = ''
          fail(`a stream event is larger than ${MAX_EVENT_BYTES} bytes`)
        }
        flushOut(controller)
      },
      flush(controller) {
        if (!ended) {
          buffer += decoder.decode()
          if (buffer.trim().length > 0) onEvent(buffer)
          buffer = ''
          if (!ended) fail('the stream ended early')
        }
        flushOut(controller)
      },
    })
  }
}
