import { InvalidValue, UpstreamFailed, UpstreamRejected, UpstreamTimeout } from '../../../errors.ts'
import type { UpstreamAdapter, UpstreamCall, UpstreamReply } from '../../adapter.ts'
import { cleanUpstreamMessage } from '../../redact.ts'
import type { Usage } from '../../sse.ts'
import type { Watchdog } from '../../watchdog.ts'
import { internalBody, readCapped, sendHttp } from '../http.ts'
import { floatsToBase64, lineSplitter, randomId, SSE_DONE, sseEvent, translatedJson } from '../lines.ts'

// Yandex Cloud's Foundation Models REST API (YandexGPT):
//   POST {base}/foundationModels/v1/completion     {modelUri, completionOptions, messages}
//   POST {base}/foundationModels/v1/textEmbedding  {modelUri, text}: one text per call
// Auth `Api-Key <key>` (or `Bearer <IAM token>`), `x-folder-id`. Token counts are strings. The
// stream is newline-delimited JSON, each line holding the whole text so far.

/** Parallel textEmbedding calls of one OpenAI embeddings request. */
const EMBED_CONCURRENCY = 4
const MAX_REPLY_BYTES = 64 * 1024 * 1024
/** How long one textEmbedding reply's body may take to arrive. */
const EMBED_READ_MS = 30_000

/** {error: {grpcCode, httpCode, message, httpStatus}} or {code, message}. */
function yandexError(body: string): string {
  try {
    const parsed = JSON.parse(body) as { error?: { message?: unknown } | string; message?: unknown }
    const e = parsed?.error
    const m = typeof e === 'string' ? e : (e?.message ?? parsed?.message)
    if (typeof m === 'string') return m
  } catch {
    // the text
  }
  return body.slice(0, 4096)
}

/** 400 (and 413/422) is the request refused; 401, 403, 404, 429, 5xx fail the node over. */
function classify(call: UpstreamCall, status: number, body: string): Error {
  if (status === 400 || status === 413 || status === 422) {
    const message = yandexError(body)
    return new UpstreamRejected(
      `upstream rejected the request: ${cleanUpstreamMessage(message)}`,
      status,
      null,
      message.slice(0, 4096),
    )
  }
  return new UpstreamFailed(`${call.route.node} answered ${status}`, 'upstream_error', status)
}

/** A token count as Yandex sends it (a decimal string, or a number): undefined when not sane. */
function count(v: unknown): number | undefined {
  const n = typeof v === 'string' && /^\d{1,10}$/.test(v) ? Number(v) : v
  return typeof n === 'number' && Number.isSafeInteger(n) && n >= 0 ? n : undefined
}

function openAIUsage(u: unknown): Usage | undefined {
  if (!u || typeof u !== 'object') return undefined
  const { inputTextTokens, completionTokens, totalTokens } = u as Record<string, unknown>
  const p = count(inputTextTokens)
  const c = count(completionTokens)
  if (p === undefined || c === undefined) return undefined
  return { prompt_tokens: p, completion_tokens: c, total_tokens: count(totalTokens) ?? p + c }
}

function finishReason(status: unknown): string | null {
  switch (status) {
    case 'ALTERNATIVE_STATUS_FINAL':
      return 'stop'
    case 'ALTERNATIVE_STATUS_TRUNCATED_FINAL':
      return 'length'
    case 'ALTERNATIVE_STATUS_CONTENT_FILTER':
      return 'content_filter'
    case 'ALTERNATIVE_STATUS_TOOL_CALLS':
      return 'tool_calls'
    default:
      return null // PARTIAL, UNSPECIFIED: not final
  }
}

function textOf(content: unknown, where: string): string {
  if (content === null || content === undefined) return ''
  if (typeof content === 'string') return content
  if (!Array.isArray(content))
    throw new InvalidValue(`${where}.content must be a string or an array of parts`, where)
  let text = ''
  for (const part of content as { type?: unknown; text?: unknown }[]) {
    if (part?.type === 'text' && typeof part.text === 'string') text += part.text
    else throw new InvalidValue(`${where}: YandexGPT routes take text parts only`, where)
  }
  return text
}

const modelUri = (scheme: 'gpt' | 'emb', folder: string | undefined, model: string) =>
  model.includes('://') ? model : `${scheme}://${folder ?? ''}/${model}`

function argumentsObject(raw: unknown, where: string): Record<string, unknown> {
  if (raw === undefined || raw === '') return {}
  try {
    const v = typeof raw === 'string' ? JSON.parse(raw) : raw
    if (v && typeof v === 'object' && !Array.isArray(v)) return v as Record<string, unknown>
  } catch {
    // below
  }
  throw new InvalidValue(`${where}.function.arguments must be a JSON object for YandexGPT`, where)
}

interface OpenAIMessage {
  role?: unknown
  content?: unknown
  name?: unknown
  tool_call_id?: unknown
  tool_calls?: { id?: unknown; function?: { name?: unknown; arguments?: unknown } }[]
}

/** Tropa's OpenAI chat body -> the completion request. Throws InvalidValue for what it cannot take. */
export function toYandexRequest(
  body: Record<string, unknown>,
  folder: string | undefined,
): Record<string, unknown> {
  const rf = body.response_format as { type?: unknown } | undefined
  if (rf && rf.type !== 'text')
    throw new InvalidValue('response_format is not supported on YandexGPT routes', 'response_format')
  if (typeof body.n === 'number' && body.n !== 1)
    throw new InvalidValue('n must be 1 on YandexGPT routes', 'n')
  const messages = (Array.isArray(body.messages) ? body.messages : []) as OpenAIMessage[]
  const out: Record<string, unknown>[] = []
  const callNames = new Map<string, string>()
  // Consecutive tool results go back as one toolResultList message.
  let results: { functionResult: { name: string; content: string } }[] | undefined
  messages.forEach((m, i) => {
    const where = `messages[${i}]`
    if (m.role === 'tool' || m.role === 'function') {
      const name =
        (typeof m.tool_call_id === 'string' && callNames.get(m.tool_call_id)) ||
        (typeof m.name === 'string' ? m.name : '')
      const result = { functionResult: { name, content: textOf(m.content, where) } }
      if (results) results.push(result)
      else {
        results = [result]
        out.push({ role: 'assistant', toolResultList: { toolResults: results } })
      }
      return
    }
    results = undefined
    const role = m.role === 'developer' ? 'system' : m.role
    if (role !== 'system' && role !== 'user' && role !== 'assistant')
      throw new InvalidValue(
        `${where}.role ${JSON.stringify(m.role)} is not supported on YandexGPT routes`,
        where,
      )
    const text = textOf(m.content, where)
    const calls = role === 'assistant' && Array.isArray(m.tool_calls) ? m.tool_calls : []
    // A message holds text or a toolCallList, not both.
    if (text !== '' || calls.length === 0) out.push({ role, text })
    if (calls.length > 0)
      out.push({
        role: 'assistant',
        toolCallList: {
          toolCalls: calls.map((c, j) => {
            const name = typeof c?.function?.name === 'string' ? c.function.name : ''
            if (typeof c?.id === 'string') callNames.set(c.id, name)
            return {
              functionCall: {
                name,
                arguments: argumentsObject(c?.function?.arguments, `${where}.tool_calls[${j}]`),
              },
            }
          }),
        },
      })
  })
  const options: Record<string, unknown> = { stream: body.stream === true }
  if (typeof body.temperature === 'number') options.temperature = body.temperature
  const maxTokens = body.max_tokens ?? body.max_completion_tokens
  if (typeof maxTokens === 'number') options.maxTokens = String(maxTokens)
  const req: Record<string, unknown> = {
    modelUri: modelUri('gpt', folder, String(body.model)),
    completionOptions: options,
    messages: out,
  }
  const tools = yandexTools(body)
  if (tools) req.tools = tools
  return req
}

/**
 * OpenAI's function tools as Yandex's. The API has no tool_choice: `none` sends no tools, a named
 * function sends that one only, `auto` and `required` send them all (the model may answer in text).
 */
function yandexTools(body: Record<string, unknown>): unknown[] | undefined {
  const tools = Array.isArray(body.tools)
    ? (body.tools as { type?: unknown; function?: Record<string, unknown> }[])
    : []
  if (tools.length === 0 || body.tool_choice === 'none') return undefined
  const named = (body.tool_choice as { function?: { name?: unknown } } | undefined)?.function?.name
  const chosen = typeof named === 'string' ? tools.filter((t) => t?.function?.name === named) : tools
  if (chosen.length === 0)
    throw new InvalidValue('tool_choice names a function that is not in tools', 'tool_choice')
  return chosen.map((t, i) => {
    if (t?.type !== 'function' || !t.function)
      throw new InvalidValue(`tools[${i}]: YandexGPT routes take function tools only`, `tools[${i}]`)
    const f = t.function
    return {
      function: {
        name: f.name,
        ...(f.description !== undefined && { description: f.description }),
        parameters: f.parameters ?? { type: 'object', properties: {} },
      },
    }
  })
}

interface FunctionCall {
  functionCall?: { name?: unknown; arguments?: unknown }
}

/** Yandex's toolCalls as OpenAI's tool_calls (ids made here; arguments as a JSON string). */
function toolCalls(list: FunctionCall[], stream: boolean, from = 0) {
  return list.slice(from).map((c, j) => ({
    ...(stream && { index: from + j }),
    id: `call_${randomId()}`,
    type: 'function',
    function: {
      name: typeof c.functionCall?.name === 'string' ? c.functionCall.name : '',
      arguments:
        typeof c.functionCall?.arguments === 'string'
          ? c.functionCall.arguments
          : JSON.stringify(c.functionCall?.arguments ?? {}),
    },
  }))
}

interface Alternative {
  message?: { role?: unknown; text?: unknown; toolCallList?: { toolCalls?: FunctionCall[] } }
  status?: unknown
}
interface Result {
  alternatives?: Alternative[]
  usage?: unknown
  modelVersion?: unknown
}

function toOpenAICompletion(reply: { result?: Result } & Result, model: unknown): Record<string, unknown> {
  // The REST gateway wraps the answer in `result`; the gRPC reference shows it bare: both are read.
  const result = reply.result ?? reply
  const alternatives = Array.isArray(result.alternatives) ? result.alternatives : []
  const usage = openAIUsage(result.usage)
  return {
    id: `chatcmpl-${randomId()}`,
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model,
    choices: alternatives.map((a, index) => {
      const calls = a.message?.toolCallList?.toolCalls
      const text = typeof a.message?.text === 'string' ? a.message.text : ''
      return {
        index,
        message: {
          role: 'assistant',
          content: Array.isArray(calls) && text === '' ? null : text,
          ...(Array.isArray(calls) && calls.length > 0 && { tool_calls: toolCalls(calls, false) }),
        },
        finish_reason: finishReason(a.status) ?? 'stop',
      }
    }),
    ...(usage && { usage }),
  }
}

/**
 * The newline-delimited stream into OpenAI's chunks. Each line holds the whole text so far: only
 * its new suffix is sent, and only the length sent so far is kept. A final status ends the text;
 * its line's usage becomes the usage chunk, then [DONE].
 */
function streamReply(response: Response, model: unknown, node: string): Response {
  const id = `chatcmpl-${randomId()}`
  const created = Math.floor(Date.now() / 1000)
  const chunk = (delta: Record<string, unknown>, finish: string | null) => ({
    id,
    object: 'chat.completion.chunk',
    created,
    model,
    choices: [{ index: 0, delta, finish_reason: finish }],
  })
  let sent = 0
  let callsSent = 0
  let first = true
  let finished = false
  const body = response.body
  if (!body) throw new UpstreamFailed(`${node} sent an empty stream`, 'upstream_error')
  const out = body.pipeThrough(lineSplitter(node)).pipeThrough(
    new TransformStream<string, Uint8Array>({
      transform(line, controller) {
        if (finished || line.trim() === '') return
        let parsed: { result?: Result; error?: unknown } & Result
        try {
          parsed = JSON.parse(line) as { result?: Result; error?: unknown } & Result
        } catch {
          throw new UpstreamFailed(`${node} sent a stream line that is not JSON`, 'upstream_error')
        }
        const result = parsed?.result ?? (Array.isArray(parsed?.alternatives) ? parsed : undefined)
        if (!result) {
          const m = yandexError(line)
          throw new UpstreamFailed(`${node} failed mid-stream: ${cleanUpstreamMessage(m)}`, 'upstream_error')
        }
        const alt = result.alternatives?.[0]
        const text = typeof alt?.message?.text === 'string' ? alt.message.text : ''
        const finish = finishReason(alt?.status)
        if (text.length > sent || first) {
          const delta: Record<string, unknown> = first ? { role: 'assistant' } : {}
          if (text.length > sent) delta.content = text.slice(sent)
          sent = Math.max(sent, text.length)
          first = false
          controller.enqueue(sseEvent(chunk(delta, null)))
        }
        // Tool calls come whole; each is sent once, however many lines repeat it.
        const calls = alt?.message?.toolCallList?.toolCalls
        if (Array.isArray(calls) && calls.length > callsSent) {
          controller.enqueue(sseEvent(chunk({ tool_calls: toolCalls(calls, true, callsSent) }, null)))
          callsSent = calls.length
        }
        if (finish) {
          finished = true
          controller.enqueue(sseEvent(chunk({}, finish)))
          const usage = openAIUsage(result.usage)
          if (usage)
            controller.enqueue(
              sseEvent({ id, object: 'chat.completion.chunk', created, model, choices: [], usage }),
            )
          controller.enqueue(SSE_DONE)
        }
      },
    }),
  )
  return new Response(out, { status: 200, headers: { 'content-type': 'text/event-stream' } })
}

async function readJson(response: Response, node: string): Promise<Record<string, unknown>> {
  const text = await readCapped(response, MAX_REPLY_BYTES)
  try {
    const v = JSON.parse(text) as unknown
    if (v && typeof v === 'object') return v as Record<string, unknown>
  } catch {
    // below
  }
  throw new UpstreamFailed(`${node} sent a reply that is not JSON`, 'upstream_error')
}

/** YandexGPT through the Foundation Models REST API. See README.md. */
export class YandexAdapter implements UpstreamAdapter {
  constructor(private readonly watchdog: Watchdog) {}

  private headers(call: UpstreamCall): Record<string, string> {
    const key = call.route.apiKey ?? ''
    return {
      ...call.route.headers,
      'content-type': 'application/json',
      accept: 'application/json',
      // An IAM token (t1.…) goes as Bearer; an API key as Api-Key.
      authorization: key.startsWith('t1.') ? `Bearer ${key}` : `Api-Key ${key}`,
      ...(call.route.folderId !== undefined && { 'x-folder-id': call.route.folderId }),
    }
  }

  async send(
    call: UpstreamCall,
    controller: AbortController,
    headersDeadlineMs: number,
  ): Promise<UpstreamReply> {
    const body = internalBody(call)
    const node = call.route.node
    if (call.path === '/embeddings') return this.embeddings(call, body, controller, headersDeadlineMs)
    const reply = await sendHttp(
      call,
      {
        url: `${call.route.baseUrl}/foundationModels/v1/completion`,
        headers: this.headers(call),
        body: JSON.stringify(toYandexRequest(body, call.route.folderId)),
      },
      controller,
      headersDeadlineMs,
      this.watchdog,
      classify,
    )
    const response = call.stream
      ? streamReply(reply.response, body.model, node)
      : translatedJson(async () => toOpenAICompletion(await readJson(reply.response, node), body.model))
    return { response, abort: reply.abort }
  }

  /** One textEmbedding call per input (a few at a time), assembled into OpenAI's list. */
  private async embeddings(
    call: UpstreamCall,
    body: Record<string, unknown>,
    controller: AbortController,
    headersDeadlineMs: number,
  ): Promise<UpstreamReply> {
    const input = typeof body.input === 'string' ? [body.input] : body.input
    if (!Array.isArray(input) || input.length === 0 || input.some((t) => typeof t !== 'string'))
      throw new InvalidValue('YandexGPT routes embed text inputs only (not token arrays)', 'input')
    const texts = input as string[]
    const uri = modelUri('emb', call.route.folderId, String(body.model))
    const headers = this.headers(call)
    const vectors: unknown[] = new Array(texts.length)
    let tokens = 0
    let counted = true
    let next = 0
    const worker = async () => {
      while (next < texts.length && !controller.signal.aborted) {
        const i = next++
        const reply = await sendHttp(
          call,
          {
            url: `${call.route.baseUrl}/foundationModels/v1/textEmbedding`,
            headers,
            body: JSON.stringify({ modelUri: uri, text: texts[i] }),
          },
          controller,
          headersDeadlineMs,
          this.watchdog,
          classify,
        )
        // The body under its own deadline: a stalled one must not hold the request.
        const d = this.watchdog.watch(Date.now() + EMBED_READ_MS, () =>
          controller.abort(new UpstreamTimeout(`${call.route.node} stalled in its embedding reply`)),
        )
        let r: { embedding?: unknown; numTokens?: unknown }
        try {
          r = await readJson(reply.response, call.route.node)
        } finally {
          this.watchdog.clear(d)
        }
        if (!Array.isArray(r.embedding))
          throw new UpstreamFailed(`${call.route.node} sent no embedding`, 'upstream_error')
        const n = count(r.numTokens)
        if (n === undefined) counted = false
        else tokens += n
        vectors[i] = body.encoding_format === 'base64' ? floatsToBase64(r.embedding as number[]) : r.embedding
      }
    }
    try {
      await Promise.all(Array.from({ length: Math.min(EMBED_CONCURRENCY, texts.length) }, worker))
    } catch (err) {
      // One call failed: the others stop (their requests share the attempt's controller).
      if (controller.signal.aborted) throw controller.signal.reason
      controller.abort(err)
      throw err
    }
    if (controller.signal.aborted) throw controller.signal.reason
    const openai = {
      object: 'list',
      data: vectors.map((embedding, index) => ({ object: 'embedding', index, embedding })),
      model: body.model,
      ...(counted && { usage: { prompt_tokens: tokens, total_tokens: tokens } }),
    }
    return {
      response: new Response(JSON.stringify(openai), {
        status: 200,
        headers: { 'content-type': 'application/json' },
      }),
      abort: (reason) => controller.abort(reason),
    }
  }
}
