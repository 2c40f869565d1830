import type { ChatRequest } from '../api/chat.ts'
import type { CompletionRequest } from '../api/completions.ts'
import type { ModelConfig } from '../config/load.ts'
import { ContextLengthExceeded, InvalidValue } from '../errors.ts'
import type { RequestTrace } from '../tracing/span.ts'
import { TEXT_COMPLETION_STREAM } from '../upstream/sse.ts'
import {
  type ChatCompletion,
  type ChatDeps,
  chatWithModel,
  fallbackChain,
  outputBudget,
  type Payer,
  runModelCall,
  withFallbacks,
} from './chat.ts'
import { NO_PREFIX, textPrefix } from './prefix.ts'
import { loadTokenizer, PromptCounter } from './tokens.ts'

// POST /v1/completions (legacy) on a chat model, in one of two ways, chosen per model:
// - passed through, when every route of the model is OpenAI-compatible (vLLM, llama.cpp's server
//   and the like serve /v1/completions natively): the request goes to each route's /completions
//   as the client sent it (model, the output bound and include_usage set by Tropa), through the
//   lifecycle chat uses (runModelCall: reserve, route with failover, relay, settle);
// - translated otherwise: the prompt as one user message, the chat lifecycle run unchanged (the
//   same bill as the same chat request), the answer translated back into `text_completion`
//   objects, a stream event by event. What chat cannot carry (several prompts, token arrays,
//   n, best_of, suffix, echo, logprobs) is refused with a 400 there.
// One rule per model, not per route: the request is checked, counted and reserved for before a
// node is chosen, and failover between its nodes must not change what is billed or allowed.

/** OpenAI's default for the legacy endpoint when max_tokens is absent or null. */
export const LEGACY_DEFAULT_MAX_TOKENS = 16
/** The longest stream event the translation holds while it waits for the event's end. */
export const MAX_EVENT_BYTES = 1024 * 1024

/** Whether a model's legacy completions are passed through: all its routes are OpenAI-compatible. */
export function passesCompletionsThrough(model: ModelConfig): boolean {
  return model.routes.every((r) => r.provider === 'openai')
}

export async function textCompletion(
  deps: ChatDeps,
  payer: Payer,
  body: CompletionRequest,
  signal: AbortSignal,
  requestId: string,
  sessionHint?: string,
  cut?: () => void,
  trace?: RequestTrace,
): Promise<Response> {
  const catalogue = deps.catalogue
  const model = (id: string) => catalogue.getOfKind(id, 'chat')
  // A request only a pass-through can carry falls back only to models that pass through.
  const translatable = untranslatable(body) === undefined
  const chain = fallbackChain(catalogue, body.model, undefined).filter(
    (id, i) => i === 0 || translatable || passesCompletionsThrough(model(id)),
  )
  return withFallbacks(deps, chain, signal, requestId, (id) => {
    const m = model(id)
    return passesCompletionsThrough(m)
      ? passThrough(deps, payer, m, { ...body, model: id }, signal, requestId, sessionHint, cut, trace)
      : translated(deps, payer, { ...body, model: id }, signal, requestId, sessionHint, cut, trace)
  })
}

/** The request as the client sent it, to the routes' /completions. */
async function passThrough(
  deps: ChatDeps,
  payer: Payer,
  model: ModelConfig,
  body: CompletionRequest,
  signal: AbortSignal,
  requestId: string,
  sessionHint: string | undefined,
  cut: (() => void) | undefined,
  trace: RequestTrace | undefined,
): Promise<Response> {
  const startedAtMs = Date.now()
  const prompts = promptsOf(body.prompt)
  await loadTokenizer()
  // Each prompt is counted (a text a slice at a time; a token array is its length) and must fit
  // the context with its output; the rate limit and the reservation take them all.
  const counter = new PromptCounter(Number.POSITIVE_INFINITY, payer.org.id)
  let longest = 0
  let firstTokens = 0
  for (let i = 0; i < prompts.length; i++) {
    const p = prompts[i]!
    const before = counter.n
    if (typeof p === 'string') {
      counter.limit = before + model.contextLength
      const slow = counter.add(p)
      if (slow) await slow
    } else counter.n += p.length
    const n = counter.n - before
    if (n > model.contextLength)
      throw new ContextLengthExceeded(
        `prompt ${i} has ${n} tokens; ${model.id} takes at most ${model.contextLength}`,
        'prompt',
      )
    if (i === 0) firstTokens = n
    if (n > longest) longest = n
  }
  const { maxOut, worstOutputTokens } = legacyOutput(model, body, longest, prompts.length)
  const stream = body.stream === true
  const first = prompts[0]
  return runModelCall(
    deps,
    payer,
    {
      model,
      path: '/completions',
      startedAtMs,
      promptTokens: counter.n,
      worstOutputTokens,
      stream,
      includeUsage: body.stream_options?.include_usage === true,
      prefix: () =>
        model.routes.length > 1 && typeof first === 'string'
          ? textPrefix(model.id, first, firstTokens)
          : NO_PREFIX,
      session: sessionHint ?? body.user,
      completionId: `cmpl-${requestId}`,
      // Only include_usage goes in stream_options, as for chat: billing reads the usage.
      body: (upstreamModel) =>
        JSON.stringify(
          stream
            ? { ...body, model: upstreamModel, max_tokens: maxOut, stream_options: { include_usage: true } }
            : { ...body, model: upstreamModel, max_tokens: maxOut },
        ),
      textOf: textOfCompletion,
      shape: TEXT_COMPLETION_STREAM,
      trace,
    },
    signal,
    requestId,
    cut,
  )
}

/**
 * The output bound sent upstream (max_tokens, 16 when absent; 400 when the longest prompt leaves
 * no room for it) and the output tokens reserved for: that bound for each choice of each prompt
 * (n choices, or best_of candidates where that is larger: they are generated and billed).
 */
export function legacyOutput(
  model: ModelConfig,
  body: Pick<CompletionRequest, 'max_tokens' | 'n' | 'best_of'>,
  longestPrompt: number,
  prompts: number,
): { maxOut: number; worstOutputTokens: number } {
  const maxOut = outputBudget(model, longestPrompt, body.max_tokens ?? LEGACY_DEFAULT_MAX_TOKENS)
  return { maxOut, worstOutputTokens: maxOut * prompts * Math.max(1, body.n ?? 1, body.best_of ?? 1) }
}

/**
 * The prompts of a request: a text, texts, one token array, or token arrays. An array mixing
 * token ids with anything else is none of these: 400.
 */
export function promptsOf(prompt: CompletionRequest['prompt']): (string | number[])[] {
  if (typeof prompt === 'string') return [prompt]
  if (prompt.every((p) => typeof p === 'number')) return [prompt as number[]]
  if (prompt.some((p) => typeof p === 'number'))
    throw new InvalidValue(
      'prompt: an array holds texts, token ids, or token arrays, not a mix of token ids and others',
      'prompt',
    )
  return prompt as (string | number[])[]
}

/** A text_completion's generated text (its choices' `text`). */
function textOfCompletion(value: ChatCompletion): string {
  let text = ''
  for (const c of value.choices as { text?: unknown }[]) if (typeof c?.text === 'string') text += c.text
  return text
}

/** Run as the chat request it stands for, and the answer translated back. */
async function translated(
  deps: ChatDeps,
  payer: Payer,
  body: CompletionRequest,
  signal: AbortSignal,
  requestId: string,
  sessionHint: string | undefined,
  cut: (() => void) | undefined,
  trace: RequestTrace | undefined,
): Promise<Response> {
  const chat = toChat(body)
  const res = await chatWithModel(deps, payer, chat, signal, requestId, sessionHint, cut, trace)
  if (payer.quoteOnly) return res
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

/** What a chat request cannot carry: the param and why, or undefined. */
function untranslatable(body: CompletionRequest): [string, string] | undefined {
  if (typeof body.prompt !== 'string') {
    if (body.prompt.some((p) => typeof p !== 'string'))
      return ['prompt', 'token arrays are served only by models whose routes are all OpenAI-compatible']
    if (body.prompt.length !== 1)
      return [
        'prompt',
        'an array must hold exactly one string on this model (several prompts are served only by models whose routes are all OpenAI-compatible; send one request per prompt)',
      ]
  }
  if ((body.n ?? 1) > 1) return ['n', 'more than one choice is not supported on this model']
  if ((body.best_of ?? 1) > 1) return ['best_of', 'more than one candidate is not supported on this model']
  if (body.suffix != null && body.suffix !== '') return ['suffix', 'is not supported on this model']
  if (body.echo === true) return ['echo', 'is not supported on this model']
  if (body.logprobs != null) return ['logprobs', 'is not supported on this model']
  return undefined
}

/**
 * The chat request a completions request stands for; 400 for what it cannot carry (a model
 * whose routes are all OpenAI-compatible takes those through passThrough instead).
 */
export function toChat(body: CompletionRequest): ChatRequest {
  const refused = untranslatable(body)
  if (refused) throw new InvalidValue(`${refused[0]}: ${refused[1]} on /v1/completions`, refused[0])
  const chat: ChatRequest = {
    model: body.model,
    messages: [
      { role: 'user', content: typeof body.prompt === 'string' ? body.prompt : (body.prompt[0] as string) },
    ],
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
