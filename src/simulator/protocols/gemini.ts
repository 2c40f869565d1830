import type { ProtocolFront, SimCore } from './front.ts'

// Google's Gemini API (https://ai.google.dev/api) in front of a simulated node:
//   POST /v1beta/models/{model}:generateContent   (and /v1/..., the SDK's default version)
//   POST /v1beta/models/{model}:streamGenerateContent?alt=sse   (`data: {chunk}` events, CRLF)
//   POST /v1beta/models/{model}:batchEmbedContents | :embedContent
// Auth: `x-goog-api-key` (or `?key=`). No key: 403 PERMISSION_DENIED; a key that is not shaped
// like a Google API key (`AIza...`) is "not valid": 400 INVALID_ARGUMENT with an ErrorInfo
// reason API_KEY_INVALID, as Google answers a wrong key. Errors are Google's
// `{"error":{"code","message","status"}}`. Checked with @google/genai (test/providers/gemini-sim.test.ts).

type Json = Record<string, unknown>

const STATUS: Record<number, string> = {
  400: 'INVALID_ARGUMENT',
  401: 'UNAUTHENTICATED',
  403: 'PERMISSION_DENIED',
  404: 'NOT_FOUND',
  429: 'RESOURCE_EXHAUSTED',
  500: 'INTERNAL',
  503: 'UNAVAILABLE',
  504: 'DEADLINE_EXCEEDED',
}

function googleError(code: number, message: string, status = STATUS[code] ?? 'UNKNOWN', details?: Json[]) {
  return Response.json({ error: { code, message, status, ...(details && { details }) } }, { status: code })
}

/** The node's OpenAI error response in Google's shape, same status. */
async function fromOpenAIError(res: Response): Promise<Response> {
  let message = `error ${res.status}`
  try {
    const e = ((await res.json()) as { error?: { message?: unknown } }).error
    if (typeof e?.message === 'string') message = e.message
  } catch {
    // status alone
  }
  const out = googleError(res.status, message)
  const retry = res.headers.get('retry-after')
  if (retry) out.headers.set('retry-after', retry)
  return out
}

const PATH = /^\/v1(?:beta)?\/models\/([^/:]+):([A-Za-z]+)$/

export const geminiFront: ProtocolFront = async (req, core) => {
  const url = new URL(req.url)
  const m = PATH.exec(url.pathname)
  if (req.method !== 'POST' || !m)
    return googleError(404, `Method not found: ${req.method} ${url.pathname}`, 'NOT_FOUND')
  const key = req.headers.get('x-goog-api-key') ?? url.searchParams.get('key')
  if (!key)
    return googleError(
      403,
      "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
    )
  if (!key.startsWith('AIza'))
    return googleError(400, 'API key not valid. Please pass a valid API key.', 'INVALID_ARGUMENT', [
      {
        '@type': 'type.googleapis.com/google.rpc.ErrorInfo',
        reason: 'API_KEY_INVALID',
        domain: 'googleapis.com',
        metadata: { service: 'generativelanguage.googleapis.com' },
      },
    ])
  const failed = core.fault()
  if (failed) return fromOpenAIError(failed)
  let body: Json
  try {
    body = (await req.json()) as Json
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw new Error('not an object')
  } catch {
    return googleError(400, 'Invalid JSON payload received.')
  }
  const model = decodeURIComponent(m[1]!)
  switch (m[2]) {
    case 'generateContent':
      return generate(body, model, core, req.signal, false)
    case 'streamGenerateContent':
      if (url.searchParams.get('alt') !== 'sse')
        return googleError(400, 'this simulator streams with alt=sse only (as the SDKs ask)')
      return generate(body, model, core, req.signal, true)
    case 'batchEmbedContents':
      return embed(body, model, core, true)
    case 'embedContent':
      return embed(body, model, core, false)
    default:
      return googleError(404, `Method not found: ${m[2]}`, 'NOT_FOUND')
  }
}

class BadRequest extends Error {}

interface Part {
  text?: unknown
  inlineData?: { mimeType?: unknown; data?: unknown }
  fileData?: { mimeType?: unknown; fileUri?: unknown }
  functionCall?: { name?: unknown; args?: unknown }
  functionResponse?: { name?: unknown; response?: unknown }
}

/** Gemini's request as the node's OpenAI chat body. */
function toOpenAI(body: Json, model: string, stream: boolean): Json {
  const contents = body.contents
  if (!Array.isArray(contents) || contents.length === 0)
    throw new BadRequest('* GenerateContentRequest.contents: contents is not specified')
  const messages: Json[] = []
  const sys = (body.systemInstruction as { parts?: unknown } | undefined)?.parts
  if (Array.isArray(sys)) {
    const text = (sys as Part[]).map((p) => (typeof p?.text === 'string' ? p.text : '')).join('')
    if (text) messages.push({ role: 'system', content: text })
  }
  let callSeq = 0
  const pending: { id: string; name: string }[] = []
  contents.forEach((c, i) => {
    const content = c as { role?: unknown; parts?: unknown }
    const role = content?.role ?? 'user'
    if (role !== 'user' && role !== 'model') throw new BadRequest('Please use a valid role: user, model.')
    if (!Array.isArray(content.parts) || content.parts.length === 0)
      throw new BadRequest(`* GenerateContentRequest.contents[${i}].parts: contents.parts must not be empty.`)
    const userParts: Json[] = []
    const calls: Json[] = []
    let text = ''
    for (const p of content.parts as Part[]) {
      if (typeof p?.text === 'string') {
        text += p.text
        userParts.push({ type: 'text', text: p.text })
      } else if (p?.inlineData && typeof p.inlineData.data === 'string') {
        userParts.push({
          type: 'image_url',
          image_url: { url: `data:${String(p.inlineData.mimeType)};base64,${p.inlineData.data}` },
        })
      } else if (p?.fileData && typeof p.fileData.fileUri === 'string') {
        userParts.push({ type: 'image_url', image_url: { url: p.fileData.fileUri } })
      } else if (p?.functionCall && typeof p.functionCall.name === 'string') {
        const id = `call_${++callSeq}`
        pending.push({ id, name: p.functionCall.name })
        calls.push({
          id,
          type: 'function',
          function: { name: p.functionCall.name, arguments: JSON.stringify(p.functionCall.args ?? {}) },
        })
      } else if (p?.functionResponse && typeof p.functionResponse.name === 'string') {
        const at = pending.findIndex((x) => x.name === p.functionResponse!.name)
        if (at < 0)
          throw new BadRequest(
            `* GenerateContentRequest.contents[${i}]: function response ${p.functionResponse.name} answers no function call`,
          )
        const id = pending.splice(at, 1)[0]!.id
        messages.push({
          role: 'tool',
          tool_call_id: id,
          content: JSON.stringify(p.functionResponse.response ?? {}),
        })
      } else throw new BadRequest(`* GenerateContentRequest.contents[${i}].parts: unsupported part`)
    }
    if (role === 'model') {
      if (text || calls.length > 0)
        messages.push({
          role: 'assistant',
          content: text || null,
          ...(calls.length > 0 && { tool_calls: calls }),
        })
    } else if (userParts.length > 0) messages.push({ role: 'user', content: userParts })
  })
  const out: Json = { model, messages, stream }
  if (stream) out.stream_options = { include_usage: true }
  const decls = ((body.tools as { functionDeclarations?: unknown }[] | undefined) ?? []).flatMap((t) =>
    Array.isArray(t?.functionDeclarations) ? (t.functionDeclarations as Json[]) : [],
  )
  decls.forEach((d, j) => {
    if (typeof d.name !== 'string' || !FUNCTION_NAME.test(d.name))
      throw new BadRequest(
        `* GenerateContentRequest.tools[0].function_declarations[${j}].name: Invalid function name. Must start with a letter or an underscore. Must be alphameric (a-z, A-Z, 0-9), underscores (_), dots (.), colons (:), or dashes (-), with a maximum length of 64.`,
      )
  })
  if (decls.length > 0)
    out.tools = decls.map((d) => ({
      type: 'function',
      function: {
        name: d.name,
        description: d.description,
        parameters: d.parametersJsonSchema ?? lowerTypes(d.parameters),
      },
    }))
  const fc = (
    body.toolConfig as { functionCallingConfig?: { mode?: unknown; allowedFunctionNames?: unknown } }
  )?.functionCallingConfig
  if (fc?.mode === 'NONE') out.tool_choice = 'none'
  else if (fc?.mode === 'ANY') {
    const names = fc.allowedFunctionNames
    out.tool_choice =
      Array.isArray(names) && names.length === 1
        ? { type: 'function', function: { name: names[0] } }
        : 'required'
  }
  const g = (body.generationConfig ?? {}) as Json
  if (typeof g.maxOutputTokens === 'number') out.max_tokens = g.maxOutputTokens
  if (typeof g.temperature === 'number') out.temperature = g.temperature
  if (typeof g.topP === 'number') out.top_p = g.topP
  if (typeof g.seed === 'number') out.seed = g.seed
  if (Array.isArray(g.stopSequences)) out.stop = g.stopSequences
  if (typeof g.candidateCount === 'number' && g.candidateCount !== 1)
    throw new BadRequest('this simulator generates one candidate (candidateCount 1)')
  return out
}

const FUNCTION_NAME = /^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$/

/** Gemini's Schema writes types in capitals (OBJECT, STRING); JSON Schema in lower case. */
function lowerTypes(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(lowerTypes)
  if (!schema || typeof schema !== 'object') return schema
  const out: Json = {}
  for (const [k, v] of Object.entries(schema))
    out[k] = k === 'type' && typeof v === 'string' ? v.toLowerCase() : lowerTypes(v)
  return out
}

const FINISH: Record<string, string> = {
  stop: 'STOP',
  length: 'MAX_TOKENS',
  tool_calls: 'STOP',
  content_filter: 'SAFETY',
}

interface OpenAIUsage {
  prompt_tokens?: number
  completion_tokens?: number
  prompt_tokens_details?: { cached_tokens?: number } | null
}

function usageMetadata(u: OpenAIUsage | undefined): Json | undefined {
  if (!u || typeof u.prompt_tokens !== 'number') return undefined
  const prompt = u.prompt_tokens
  const out = u.completion_tokens ?? 0
  const cached = u.prompt_tokens_details?.cached_tokens ?? 0
  return {
    promptTokenCount: prompt,
    candidatesTokenCount: out,
    totalTokenCount: prompt + out,
    ...(cached > 0 && { cachedContentTokenCount: cached }),
    promptTokensDetails: [{ modality: 'TEXT', tokenCount: prompt }],
  }
}

interface OpenAIToolCall {
  index?: number
  id?: string
  function?: { name?: string; arguments?: string }
}

function callPart(name: string, args: string): Json {
  let parsed: unknown = {}
  try {
    parsed = JSON.parse(args || '{}')
  } catch {
    // the engine's arguments are JSON
  }
  return { functionCall: { name, args: parsed } }
}

async function generate(body: Json, model: string, core: SimCore, signal: AbortSignal, stream: boolean) {
  let openai: Json
  try {
    openai = toOpenAI(body, model, stream)
  } catch (err) {
    if (err instanceof BadRequest) return googleError(400, err.message)
    throw err
  }
  const res = await core.chat(openai, signal)
  if (!res.ok) return fromOpenAIError(res)
  const responseId = crypto.randomUUID().replaceAll('-', '').slice(0, 22)
  if (!stream) {
    const r = (await res.json()) as {
      choices: {
        message: { content?: string | null; tool_calls?: OpenAIToolCall[] }
        finish_reason: string
      }[]
      usage?: OpenAIUsage
    }
    const choice = r.choices[0]!
    const parts: Json[] = []
    if (choice.message.content) parts.push({ text: choice.message.content })
    for (const c of choice.message.tool_calls ?? [])
      parts.push(callPart(c.function?.name ?? '', c.function?.arguments ?? ''))
    return Response.json({
      candidates: [
        {
          content: { parts, role: 'model' },
          finishReason: FINISH[choice.finish_reason] ?? 'OTHER',
          index: 0,
        },
      ],
      usageMetadata: usageMetadata(r.usage),
      modelVersion: model,
      responseId,
    })
  }
  return new Response(streamOut(res.body!, model, responseId), {
    headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' },
  })
}

/** The node's OpenAI SSE as Gemini's: a chunk per text delta; calls, finishReason and usage last. */
function streamOut(
  body: ReadableStream<Uint8Array>,
  model: string,
  responseId: string,
): ReadableStream<Uint8Array> {
  const reader = body.getReader()
  const decoder = new TextDecoder()
  const encoder = new TextEncoder()
  const tail = `"modelVersion":${JSON.stringify(model)},"responseId":"${responseId}"`
  const calls: { name: string; args: string }[] = []
  let finish: string | undefined
  let usage: OpenAIUsage | undefined
  let buffer = ''
  const event = (payload: string): string => {
    if (payload === '[DONE]') {
      const parts = calls.length > 0 ? calls.map((c) => callPart(c.name, c.args)) : [{ text: '' }]
      const chunk = {
        candidates: [
          { content: { parts, role: 'model' }, finishReason: FINISH[finish ?? 'stop'] ?? 'OTHER', index: 0 },
        ],
        usageMetadata: usageMetadata(usage),
      }
      return `data: ${JSON.stringify(chunk).slice(0, -1)},${tail}}\r\n\r\n`
    }
    const c = JSON.parse(payload) as {
      choices?: {
        delta?: { content?: string; tool_calls?: OpenAIToolCall[] }
        finish_reason?: string | null
      }[]
      usage?: OpenAIUsage
    }
    if (c.usage) usage = c.usage
    const choice = c.choices?.[0]
    if (!choice) return ''
    if (choice.finish_reason) finish = choice.finish_reason
    for (const t of choice.delta?.tool_calls ?? []) {
      const i = t.index ?? 0
      calls[i] ??= { name: '', args: '' }
      if (t.function?.name) calls[i].name += t.function.name
      if (t.function?.arguments) calls[i].args += t.function.arguments
    }
    const text = choice.delta?.content
    if (!text) return ''
    return `data: {"candidates":[{"content":{"parts":[{"text":${JSON.stringify(text)}}],"role":"model"},"index":0}],${tail}}\r\n\r\n`
  }
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        for (;;) {
          const { done, value } = await reader.read()
          if (done) {
            controller.close()
            return
          }
          buffer += decoder.decode(value, { stream: true })
          let out = ''
          for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
            const ev = buffer.slice(0, end)
            buffer = buffer.slice(end + 2)
            if (ev.startsWith('data: ')) out += event(ev.slice(6))
          }
          if (out) {
            controller.enqueue(encoder.encode(out))
            return
          }
        }
      } catch (err) {
        // The node broke off (a simulated cut): so does the front.
        controller.error(err)
      }
    },
    cancel(reason) {
      return reader.cancel(reason)
    },
  })
}

async function embed(body: Json, model: string, core: SimCore, batch: boolean) {
  const requests = batch ? body.requests : [{ ...body, model: `models/${model}` }]
  if (!Array.isArray(requests) || requests.length === 0)
    return googleError(400, '* BatchEmbedContentsRequest.requests: requests is not specified')
  const texts: string[] = []
  let dims: unknown
  for (const [i, r] of (requests as Json[]).entries()) {
    if (r?.model !== `models/${model}`)
      return googleError(
        400,
        `Model name in request ${i} (${String(r?.model)}) does not match the model in the URL (models/${model}).`,
      )
    const parts = (r.content as { parts?: Part[] } | undefined)?.parts
    if (!Array.isArray(parts) || parts.length === 0)
      return googleError(400, `* BatchEmbedContentsRequest.requests[${i}].content: contents is not specified`)
    texts.push(parts.map((p) => (typeof p?.text === 'string' ? p.text : '')).join(' '))
    dims ??= r.outputDimensionality
  }
  const res = await core.embeddings({ model, input: texts, ...(dims !== undefined && { dimensions: dims }) })
  if (!res.ok) return fromOpenAIError(res)
  const r = (await res.json()) as { data: { embedding: number[] }[] }
  const embeddings = r.data.map((d) => ({ values: d.embedding }))
  return Response.json(batch ? { embeddings } : { embedding: embeddings[0] })
}
