import type { ChatRequest } from '../api/chat.ts'
import type { CompletionRequest } from '../api/completions.ts'
import { InvalidValue } from '../errors.ts'
import { type ChatDeps, chatCompletion, type Payer } from './chat.ts'

// POST /v1/completions (legacy) on any chat model: the request is translated to a chat request
// (the prompt as one user message), the chat lifecycle runs unchanged (reserve, route with
// failover, relay, settle: the same bill as the same chat request), and the answer is translated
// back into `text_completion` objects, a stream event by event.

/** OpenAI's default for the legacy endpoint when max_tokens is absent or null. */
export const LEGACY_DEFAULT_MAX_TOKENS = 16
/** The longest stream event the translation holds while it waits for the event's end. */
export const MAX_EVENT_BYTES = 1024 * 1024

export async function textCompletion(
  deps: ChatDeps,
  payer: Payer,
  body: CompletionRequest,
  signal: AbortSignal,
  requestId: string,
  sessionHint?: string,
  cut?: () => void,
): Promise<Response> {
  const chat = toChat(body)
  const res = await chatCompletion(deps, payer, chat, signal, requestId, sessionHint, cut)
  const id = `cmpl-${requestId}`
  if (chat.stream !== true) {
    const out = textCompletionOf((await res.json()) as ChatCompletionJson, id)
    return new Response(JSON.stringify(out), { status: res.status, headers: res.headers })
  }
  return new Response(completionStream(res.body!, id), { status: res.status, headers: res.headers })
}

/** A chat completion (JSON) as the legacy endpoint's `text_completion` object. */
export function textCompletionOf(value: ChatCompletionJson, id: string): Record<string, unknown> {
  return {
    id,
    object: 'text_completion',
    created: value.created,
    model: value.model,
    choices: (Array.isArray(value.choices) ? value.choices : []).map((c) => ({
      text: typeof c?.message?.content === 'string' ? c.message.content : '',
      index: c?.index ?? 0,
      logprobs: null,
      finish_reason: c?.finish_reason ?? null,
    })),
    usage: value.usage,
    ...(value.system_fingerprint !== undefined && { system_fingerprint: value.system_fingerprint }),
  }
}

/** The chat request a completions request stands for; 400 for what it cannot carry. */
export function toChat(body: CompletionRequest): ChatRequest {
  const refuse = (param: string, message: string) => {
    throw new InvalidValue(`${param}: ${message} on /v1/completions`, param)
  }
  let prompt: string
  if (typeof body.prompt === 'string') prompt = body.prompt
  else {
    if (body.prompt.some((p) => typeof p !== 'string'))
      refuse('prompt', 'token arrays are not supported (send the prompt as text)')
    if (body.prompt.length !== 1)
      refuse(
        'prompt',
        'an array must hold exactly one string (several prompts in one request are not supported; send one request per prompt)',
      )
    prompt = body.prompt[0] as string
  }
  if ((body.n ?? 1) > 1) refuse('n', 'more than one choice is not supported')
  if ((body.best_of ?? 1) > 1) refuse('best_of', 'more than one candidate is not supported')
  if (body.suffix != null && body.suffix !== '') refuse('suffix', 'is not supported')
  if (body.echo === true) refuse('echo', 'is not supported')
  if (body.logprobs != null) refuse('logprobs', 'is not supported')
  const chat: ChatRequest = {
    model: body.model,
    messages: [{ role: 'user', content: prompt }],
    max_tokens: body.max_tokens ?? LEGACY_DEFAULT_MAX_TOKENS,
  }
  if (body.stream === true) {
    chat.stream = true
    if (body.stream_options?.include_usage === true) chat.stream_options = { include_usage: true }
  }
  if (body.temperature != null) chat.temperature = body.temperature
  if (body.top_p != null) chat.top_p = body.top_p
  if (body.stop != null) chat.stop = body.stop
  if (body.presence_penalty != null) chat.presence_penalty = body.presence_penalty
  if (body.frequency_penalty != null) chat.frequency_penalty = body.frequency_penalty
  if (body.seed != null) chat.seed = body.seed
  if (body.logit_bias != null) (chat as Record<string, unknown>).logit_bias = body.logit_bias
  if (body.user !== undefined) chat.user = body.user
  return chat
}

interface ChatChoiceJson {
  index?: number
  message?: { content?: unknown }
  delta?: { content?: unknown }
  finish_reason?: string | null
}
export interface ChatCompletionJson {
  created?: number
  model?: string
  choices?: ChatChoiceJson[]
  usage?: unknown
  system_fingerprint?: unknown
}

const encoder = new TextEncoder()

/**
 * The chat SSE body (Tropa's relay output) as a legacy completions stream. Pulled one upstream
 * read at a time (highWaterMark 0: nothing is read ahead of the client), so the chat relay's
 * backpressure and its stalled-client handling hold through it; at most one event is held
 * (MAX_EVENT_BYTES). Error events, comments and [DONE] pass as they are.
 */
export function completionStream(source: ReadableStream<Uint8Array>, id: string): ReadableStream<Uint8Array> {
  const reader = source.getReader()
  const decoder = new TextDecoder()
  let buffer = ''
  let finished = false
  const translate = (text: string): string => {
    let out = ''
    let start = 0
    for (;;) {
      const end = text.indexOf('\n\n', start)
      if (end < 0) break
      out += translateEvent(text.slice(start, end + 2), id)
      start = end + 2
    }
    buffer = text.slice(start)
    return out
  }
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (finished) return
        try {
          for (;;) {
            const { done, value } = await reader.read()
            if (done) {
              const rest = translate(`${buffer}${decoder.decode()}`)
              const tail = buffer.trim().length > 0 ? translateEvent(`${buffer.trimEnd()}\n\n`, id) : ''
              finished = true
              if (rest.length + tail.length > 0) controller.enqueue(encoder.encode(rest + tail))
              controller.close()
              return
            }
            const out = translate(buffer + decoder.decode(value, { stream: true }))
            if (buffer.length > MAX_EVENT_BYTES) {
              finished = true
              reader.cancel(new Error('stream event too long')).catch(() => {})
              controller.enqueue(encoder.encode(out + errorEvent('a stream event was too long to translate')))
              controller.close()
              return
            }
            if (out.length > 0) {
              controller.enqueue(encoder.encode(out))
              return
            }
          }
        } catch {
          // The chat stream failed under us (it already billed): end the client's stream cleanly.
          if (finished) return
          finished = true
          try {
            controller.enqueue(encoder.encode(errorEvent('the stream broke')))
            controller.close()
          } catch {
            // the client is gone
          }
        }
      },
      cancel(reason) {
        finished = true
        return reader.cancel(reason)
      },
    },
    { highWaterMark: 0 },
  )
}

function errorEvent(message: string): string {
  return `data: ${JSON.stringify({ error: { message, type: 'upstream_error', param: null, code: 'upstream_error' } })}\n\n`
}

/** One chat SSE event as the legacy endpoint's; '' drops it. */
function translateEvent(event: string, id: string): string {
  if (!event.startsWith('data:')) return event
  const payload = event.slice(event.charCodeAt(5) === 32 ? 6 : 5).trimEnd()
  if (payload === '[DONE]' || !payload.startsWith('{')) return event
  let chunk: ChatCompletionJson & { error?: unknown }
  try {
    chunk = JSON.parse(payload) as typeof chunk
  } catch {
    return event
  }
  if (chunk.error !== undefined || !Array.isArray(chunk.choices)) return event
  const head = { id, object: 'text_completion', created: chunk.created, model: chunk.model }
  if (chunk.choices.length === 0)
    // the usage event; an event with neither (Azure's prompt filter results) is dropped
    return chunk.usage ? `data: ${JSON.stringify({ ...head, choices: [], usage: chunk.usage })}\n\n` : ''
  const choices = []
  for (const c of chunk.choices) {
    const text = typeof c.delta?.content === 'string' ? c.delta.content : ''
    const finish = c.finish_reason ?? null
    if (text.length === 0 && finish === null) continue
    choices.push({ text, index: c.index ?? 0, logprobs: null, finish_reason: finish })
  }
  return choices.length === 0 ? '' : `data: ${JSON.stringify({ ...head, choices })}\n\n`
}
