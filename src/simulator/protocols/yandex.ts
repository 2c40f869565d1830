import { lineSplitter } from '../../upstream/providers/lines.ts'
import type { ProtocolFront, SimCore } from './front.ts'

// Yandex Cloud Foundation Models' REST API as its reference describes it
// (yandex.cloud/docs/foundation-models/text-generation/api-ref/TextGeneration/completion):
//   POST /foundationModels/v1/completion     {modelUri: gpt://<folder>/<model>, completionOptions:
//        {stream, temperature, maxTokens (string)}, messages: [{role, text}]} ->
//        {result: {alternatives: [{message: {role, text}, status}], usage: {inputTextTokens,
//        completionTokens, totalTokens} (strings), modelVersion}}; streamed: one such JSON object
//        per line, each with the whole text so far, PARTIAL until the last (FINAL / TRUNCATED_FINAL);
//        tools: [{function: {name, description, parameters}}] -> a toolCallList message
//        ({functionCall: {name, arguments (object)}}) with ALTERNATIVE_STATUS_TOOL_CALLS; results come
//        back as a toolResultList message ({functionResult: {name, content}})
//   POST /foundationModels/v1/textEmbedding  {modelUri: emb://<folder>/<model>, text} ->
//        {embedding, numTokens (string), modelVersion}
// Auth: `Authorization: Api-Key <key>` or `Bearer <IAM token>`; `x-folder-id` (if sent, the folder
// of the modelUri). Errors: {error: {grpcCode, httpCode, message, httpStatus, details}}.
// No official JS SDK: checked with plain fetch (test/providers/yandex-sim.test.ts).

const encoder = new TextEncoder()
const MODEL_VERSION = '23.10.2024'
const HTTP_STATUS: Record<number, [number, string]> = {
  400: [3, 'Bad Request'],
  401: [16, 'Unauthorized'],
  403: [7, 'Forbidden'],
  404: [5, 'Not Found'],
  429: [8, 'Too Many Requests'],
  500: [13, 'Internal Server Error'],
  503: [14, 'Service Unavailable'],
}

export function yandexError(status: number, message: string): Response {
  const [grpcCode, httpStatus] = HTTP_STATUS[status] ?? [2, 'Unknown']
  return Response.json(
    { error: { grpcCode, httpCode: status, message, httpStatus, details: [] } },
    { status },
  )
}

const broken = () =>
  new Response(
    new ReadableStream({
      start(c) {
        c.error(new Error('simulated cut'))
      },
    }),
    { headers: { 'content-type': 'application/json' } },
  )

async function failedMessage(res: Response): Promise<string> {
  try {
    const j = (await res.json()) as { error?: { message?: string } }
    return j.error?.message ?? res.statusText
  } catch {
    return res.statusText
  }
}

/** gpt://<folder>/<model>: the folder and the model, or undefined. */
function parseUri(uri: unknown, scheme: 'gpt' | 'emb'): { folder: string; model: string } | undefined {
  if (typeof uri !== 'string') return undefined
  const m = new RegExp(`^${scheme}://([^/]+)/(.+)$`).exec(uri)
  return m ? { folder: m[1]!, model: m[2]! } : undefined
}

export const yandex: ProtocolFront = async (req, core) => {
  const path = new URL(req.url).pathname
  if (req.method === 'GET' && path === '/health') return new Response('ok')
  const known = path === '/foundationModels/v1/completion' || path === '/foundationModels/v1/textEmbedding'
  if (!known) return yandexError(404, `Not Found: ${req.method} ${path}`)
  if (req.method !== 'POST') return yandexError(404, `Not Found: ${req.method} ${path}`)
  const auth = req.headers.get('authorization') ?? ''
  const [, authScheme, key] = /^(Api-Key|Bearer) (\S+)$/.exec(auth) ?? []
  // IAM tokens (t1.…) go as Bearer, API keys as Api-Key: the other way round is refused.
  if (!key || (authScheme === 'Bearer') !== key.startsWith('t1.'))
    return yandexError(401, 'The token is invalid')
  const failed = core.fault()
  if (failed) return yandexError(failed.status, await failedMessage(failed))
  let body: Record<string, unknown>
  try {
    body = (await req.json()) as Record<string, unknown>
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw new Error('not an object')
  } catch {
    return yandexError(400, 'Request body is not a valid JSON object')
  }
  const scheme = path.endsWith('/completion') ? 'gpt' : 'emb'
  const uri = parseUri(body.modelUri, scheme)
  if (!uri) return yandexError(400, `modelUri must look like ${scheme}://<folder_id>/<model>`)
  const folder = req.headers.get('x-folder-id')
  if (folder !== null && folder !== uri.folder)
    return yandexError(403, `Permission to [resource-manager.folder ${uri.folder}] denied`)
  return scheme === 'gpt' ? completion(body, uri.model, core, req.signal) : embedding(body, uri.model, core)
}

async function completion(
  body: Record<string, unknown>,
  model: string,
  core: SimCore,
  signal: AbortSignal,
): Promise<Response> {
  const opts = (body.completionOptions ?? {}) as {
    stream?: unknown
    temperature?: unknown
    maxTokens?: unknown
  }
  if (!Array.isArray(body.messages) || body.messages.length === 0)
    return yandexError(400, 'messages: at least one message is required')
  const messages: Record<string, unknown>[] = []
  let n = 0
  const pending: string[] = []
  for (const [i, m] of (
    body.messages as {
      role?: unknown
      text?: unknown
      toolCallList?: { toolCalls?: { functionCall?: { name?: unknown; arguments?: unknown } }[] }
      toolResultList?: { toolResults?: { functionResult?: { name?: unknown; content?: unknown } }[] }
    }[]
  ).entries()) {
    if (m?.role !== 'system' && m?.role !== 'user' && m?.role !== 'assistant')
      return yandexError(400, `messages[${i}].role: unknown role ${JSON.stringify(m?.role)}`)
    const kinds = [m.text, m.toolCallList, m.toolResultList].filter((x) => x !== undefined).length
    if (kinds > 1) return yandexError(400, `messages[${i}]: only one of text, toolCallList, toolResultList`)
    if (m.toolCallList) {
      const calls = Array.isArray(m.toolCallList.toolCalls) ? m.toolCallList.toolCalls : []
      if (calls.length === 0)
        return yandexError(400, `messages[${i}].toolCallList: toolCalls cannot be empty`)
      const tool_calls = calls.map((c) => {
        const id = `call_${++n}`
        pending.push(id)
        return {
          id,
          type: 'function',
          function: {
            name: String(c.functionCall?.name ?? ''),
            arguments: JSON.stringify(c.functionCall?.arguments ?? {}),
          },
        }
      })
      messages.push({ role: 'assistant', content: null, tool_calls })
    } else if (m.toolResultList) {
      const results = Array.isArray(m.toolResultList.toolResults) ? m.toolResultList.toolResults : []
      for (const r of results) {
        if (typeof r.functionResult?.content !== 'string')
          return yandexError(400, `messages[${i}].toolResultList: functionResult.content is required`)
        messages.push({
          role: 'tool',
          tool_call_id: pending.shift() ?? `call_${++n}`,
          content: r.functionResult.content,
        })
      }
    } else {
      if (typeof m.text !== 'string' || m.text === '')
        return yandexError(400, `messages[${i}].text: the text of a message cannot be empty`)
      messages.push({ role: m.role, content: m.text })
    }
  }
  const openai: Record<string, unknown> = { model, messages }
  if (opts.maxTokens !== undefined) {
    const n = typeof opts.maxTokens === 'string' ? Number(opts.maxTokens) : opts.maxTokens
    if (typeof n !== 'number' || !Number.isSafeInteger(n) || n <= 0)
      return yandexError(400, 'completionOptions.maxTokens: a positive integer is required')
    openai.max_tokens = n
  }
  if (opts.temperature !== undefined) {
    if (typeof opts.temperature !== 'number' || opts.temperature < 0 || opts.temperature > 1)
      return yandexError(400, 'completionOptions.temperature: must be between 0 and 1')
    openai.temperature = opts.temperature
  }
  if (body.tools !== undefined) {
    if (!Array.isArray(body.tools)) return yandexError(400, 'tools: a list is required')
    const tools: unknown[] = []
    for (const [i, t] of (
      body.tools as { function?: { name?: unknown; description?: unknown; parameters?: unknown } }[]
    ).entries()) {
      if (typeof t?.function?.name !== 'string' || t.function.name === '')
        return yandexError(400, `tools[${i}].function.name is required`)
      tools.push({ type: 'function', function: t.function })
    }
    if (tools.length > 0) openai.tools = tools
  }
  const streamed = opts.stream === true
  if (streamed) {
    openai.stream = true
    openai.stream_options = { include_usage: true }
  }
  const res = await core.chat(openai, signal)
  if (!res.ok) return yandexError(res.status, await failedMessage(res))
  if (streamed) return stream(res)
  let reply: {
    choices: {
      message: { content: string | null; tool_calls?: { function: { name: string; arguments: string } }[] }
      finish_reason: string
    }[]
    usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number }
  }
  try {
    reply = await res.json()
  } catch {
    return broken()
  }
  return Response.json({
    result: {
      alternatives: reply.choices.map((c) => ({
        message: c.message.tool_calls
          ? {
              role: 'assistant',
              toolCallList: { toolCalls: c.message.tool_calls.map((t) => functionCall(t.function)) },
            }
          : { role: 'assistant', text: c.message.content ?? '' },
        status: status(c.finish_reason),
      })),
      usage: usage(reply.usage),
      modelVersion: MODEL_VERSION,
    },
  })
}

const status = (finish: string | null) =>
  finish === 'length'
    ? 'ALTERNATIVE_STATUS_TRUNCATED_FINAL'
    : finish === 'tool_calls'
      ? 'ALTERNATIVE_STATUS_TOOL_CALLS'
      : finish
        ? 'ALTERNATIVE_STATUS_FINAL'
        : 'ALTERNATIVE_STATUS_PARTIAL'

function functionCall(f: { name: string; arguments: string }) {
  let args: unknown = {}
  try {
    args = JSON.parse(f.arguments)
  } catch {
    // {}
  }
  return { functionCall: { name: f.name, arguments: args } }
}

const usage = (u: { prompt_tokens: number; completion_tokens: number; total_tokens?: number }) => ({
  inputTextTokens: String(u.prompt_tokens),
  completionTokens: String(u.completion_tokens),
  totalTokens: String(u.total_tokens ?? u.prompt_tokens + u.completion_tokens),
})

/**
 * The node's OpenAI SSE as Yandex's stream: a JSON object per line holding the whole text so far
 * (a fake may keep it: its outputs are short), the last one final with the usage.
 */
function stream(res: Response): Response {
  let text = ''
  let name = ''
  let args = ''
  let finish: string | null = null
  let prompt = 0
  let completion = 0
  const line = (st: string) =>
    encoder.encode(
      `${JSON.stringify({
        result: {
          alternatives: [
            {
              message: name
                ? {
                    role: 'assistant',
                    toolCallList: { toolCalls: [functionCall({ name, arguments: args })] },
                  }
                : { role: 'assistant', text },
              status: st,
            },
          ],
          usage: usage({ prompt_tokens: prompt, completion_tokens: completion }),
          modelVersion: MODEL_VERSION,
        },
      })}\n`,
    )
  const out = res.body!.pipeThrough(lineSplitter('sim')).pipeThrough(
    new TransformStream<string, Uint8Array>({
      transform(l, controller) {
        if (!l.startsWith('data: ') || l === 'data: [DONE]') return
        const chunk = JSON.parse(l.slice(6)) as {
          choices: {
            delta: { content?: string; tool_calls?: { function?: { name?: string; arguments?: string } }[] }
            finish_reason: string | null
          }[]
          usage?: { prompt_tokens: number; completion_tokens: number }
        }
        const c = chunk.choices[0]
        if (c?.delta.content) {
          text += c.delta.content
          completion++
          controller.enqueue(line('ALTERNATIVE_STATUS_PARTIAL'))
        }
        const fn = c?.delta.tool_calls?.[0]?.function
        if (fn?.name) name = fn.name
        if (fn?.arguments) args += fn.arguments // whole in the final line, as the API sends calls
        if (c?.finish_reason) finish = c.finish_reason
        if (chunk.usage) {
          prompt = chunk.usage.prompt_tokens
          completion = chunk.usage.completion_tokens
          controller.enqueue(line(status(finish ?? 'stop')))
        }
      },
    }),
  )
  return new Response(out, { headers: { 'content-type': 'application/json' } })
}

async function embedding(body: Record<string, unknown>, model: string, core: SimCore): Promise<Response> {
  if (typeof body.text !== 'string' || body.text === '') return yandexError(400, 'text: cannot be empty')
  const res = await core.embeddings({ model, input: body.text })
  if (!res.ok) return yandexError(res.status, await failedMessage(res))
  const r = (await res.json()) as { data: { embedding: number[] }[]; usage: { prompt_tokens: number } }
  return Response.json({
    embedding: r.data[0]!.embedding,
    numTokens: String(r.usage.prompt_tokens),
    modelVersion: MODEL_VERSION,
  })
}
