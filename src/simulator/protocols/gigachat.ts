import { lineSplitter } from '../../upstream/providers/lines.ts'
import type { ProtocolFront, SimCore } from './front.ts'

// Sber's GigaChat REST API as its reference describes it (developers.sber.ru/docs/ru/gigachat/api):
//   POST /api/v2/oauth              Basic <authorization key>, RqUID, scope=... (form) ->
//                                   {access_token, expires_at (ms)}; errors {code, message}
//   POST /api/v1/chat/completions   Bearer <access_token>; functions/function_call; SSE
//   POST /api/v1/embeddings         {model, input: [texts]} -> data[i].usage.prompt_tokens
//   GET  /api/v1/models
//   POST /api/v1/files              multipart `file` (+ `purpose`) -> {id, object: "file", bytes, ...}
//   GET  /api/v1/files/{id}, POST /api/v1/files/{id}/delete
// A chat message names stored files in `attachments` (one image a message, ten a request).
// API errors are {status, message}; an unknown or expired token is a 401.
// Checked with the official `gigachat` npm client (test/providers/gigachat-sim.test.ts).

const SCOPES = new Set(['GIGACHAT_API_PERS', 'GIGACHAT_API_B2B', 'GIGACHAT_API_CORP'])
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i
/** Live tokens kept per node before the expired ones are swept. */
const SWEEP_AT = 10_000
const encoder = new TextEncoder()

/** The storage's limits: 15 MB an image (the reference), a few text formats, a bounded count. */
const MAX_FILE_BYTES = 15 * 1024 * 1024
/** Multipart framing allowed on top of the file. */
const MAX_UPLOAD_BODY = MAX_FILE_BYTES + 64 * 1024
const MAX_STORED_FILES = 10_000
const MAX_IMAGES = 10
const FILE_TYPES = new Set([
  'image/jpeg',
  'image/jpg',
  'image/png',
  'image/tiff',
  'image/bmp',
  'image/x-ms-bmp', // Bun's multipart parser names a .bmp so
  'text/plain',
  'application/pdf',
])

interface StoredFile {
  id: string
  object: 'file'
  bytes: number
  created_at: number
  filename: string
  purpose: string
  access_policy: 'private'
}

interface NodeState {
  /** access token -> expires_at (ms epoch) */
  tokens: Map<string, number>
  /** The storage: metadata only (the bytes are not kept), the oldest dropped past MAX_STORED_FILES. */
  files: Map<string, { file: StoredFile; image: boolean }>
}
const states = new WeakMap<SimCore, NodeState>()

const apiError = (status: number, message: string) => Response.json({ status, message }, { status })
const authError = (status: number, code: number, message: string) =>
  Response.json({ code, message }, { status })

/** A 200 whose body breaks at once, as the node's own cut does. */
const broken = () =>
  new Response(
    new ReadableStream({
      start(c) {
        c.error(new Error('simulated cut'))
      },
    }),
    { headers: { 'content-type': 'application/json' } },
  )

export const gigachat: ProtocolFront = async (req, core) => {
  let state = states.get(core)
  if (!state) {
    state = { tokens: new Map(), files: new Map() }
    states.set(core, state)
  }
  const path = new URL(req.url).pathname
  if (req.method === 'GET' && path === '/health') return new Response('ok')
  if (req.method === 'POST' && path === '/api/v2/oauth') return oauth(req, core, state)
  // The simulator's own control (not GigaChat's): every token issued so far stops working, as a
  // revoked or early-expired token would.
  if (req.method === 'POST' && path === '/sim/revoke-tokens') {
    state.tokens.clear()
    return new Response(null, { status: 204 })
  }
  if (!path.startsWith('/api/v1/')) return apiError(404, `no route ${req.method} ${path}`)
  const auth = req.headers.get('authorization') ?? ''
  const token = auth.startsWith('Bearer ') ? auth.slice(7) : ''
  const expires = state.tokens.get(token)
  if (expires === undefined || expires <= Date.now()) {
    if (expires !== undefined) state.tokens.delete(token)
    return apiError(401, 'Unauthorized')
  }
  if (req.method === 'GET' && path === '/api/v1/models')
    return Response.json({
      object: 'list',
      data: ['GigaChat', 'GigaChat-Pro', 'GigaChat-Max', 'Embeddings'].map((id) => ({
        id,
        object: 'model',
        owned_by: 'salutedevices',
        type: id === 'Embeddings' ? 'embedder' : 'chat',
      })),
    })
  const fileMatch = /^\/api\/v1\/files\/([^/]+)(\/delete)?$/.exec(path)
  if (fileMatch) {
    const file = state.files.get(decodeURIComponent(fileMatch[1]!))?.file
    if (req.method === 'GET' && !fileMatch[2] && file) return Response.json(file)
    if (req.method === 'POST' && fileMatch[2] && file) {
      state.files.delete(file.id)
      return Response.json({ id: file.id, deleted: true })
    }
    if (!file) return apiError(404, 'File not found')
  }
  if (req.method === 'GET' && path === '/api/v1/files')
    return Response.json({ data: [...state.files.values()].map((f) => f.file) })
  if (req.method !== 'POST') return apiError(405, 'Method Not Allowed')
  const failed = core.fault()
  if (failed) return apiError(failed.status, await failedMessage(failed))
  if (path === '/api/v1/files') return upload(req, core, state)
  let body: Record<string, unknown>
  try {
    body = (await req.json()) as Record<string, unknown>
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw new Error('not an object')
  } catch {
    return apiError(400, 'Invalid params: the body is not a JSON object')
  }
  if (path === '/api/v1/chat/completions') return chat(body, core, state, req.signal)
  if (path === '/api/v1/embeddings') return embeddings(body, core)
  return apiError(404, `no route ${req.method} ${path}`)
}

async function failedMessage(res: Response): Promise<string> {
  try {
    const j = (await res.json()) as { error?: { message?: string } }
    return j.error?.message ?? res.statusText
  } catch {
    return res.statusText
  }
}

async function oauth(req: Request, core: SimCore, state: NodeState): Promise<Response> {
  core.countAuthRequest()
  const rquid = req.headers.get('rquid') ?? ''
  if (!UUID.test(rquid)) return authError(400, 5, 'RqUID header is invalid or missing: a UUID v4 is required')
  const auth = req.headers.get('authorization') ?? ''
  // The authorization key is base64 of "<client id>:<client secret>".
  const key = auth.startsWith('Basic ') ? auth.slice(6).trim() : ''
  let decoded = ''
  try {
    decoded = /^[A-Za-z0-9+/]+={0,2}$/.test(key) ? atob(key) : ''
  } catch {
    decoded = ''
  }
  const colon = decoded.indexOf(':')
  if (colon <= 0 || colon === decoded.length - 1)
    return authError(401, 6, "credentials doesn't match db data")
  const form = new URLSearchParams(await req.text())
  const scope = form.get('scope')
  if (!scope || !SCOPES.has(scope)) return authError(400, 7, `scope is invalid: ${scope ?? '(missing)'}`)
  const now = Date.now()
  if (state.tokens.size >= SWEEP_AT) for (const [t, e] of state.tokens) if (e <= now) state.tokens.delete(t)
  const access_token = `eyJsim.${crypto.randomUUID().replaceAll('-', '')}`
  const expires_at = now + core.tokenLifetimeMs
  state.tokens.set(access_token, expires_at)
  return Response.json({ access_token, expires_at })
}

/** POST /api/v1/files: a multipart upload, bounded before and while it is read. */
async function upload(req: Request, core: SimCore, state: NodeState): Promise<Response> {
  const type = req.headers.get('content-type') ?? ''
  if (!type.toLowerCase().startsWith('multipart/form-data'))
    return apiError(400, 'Invalid params: multipart/form-data is required')
  const length = Number(req.headers.get('content-length') ?? 'NaN')
  if (length > MAX_UPLOAD_BODY) return apiError(413, 'Payload Too Large')
  let body: Blob | undefined
  try {
    body = await readAtMost(req, MAX_UPLOAD_BODY)
  } catch {
    return apiError(400, 'Invalid params: the body could not be read')
  }
  if (!body) return apiError(413, 'Payload Too Large')
  let form: FormData
  try {
    form = await new Response(body, { headers: { 'content-type': type } }).formData()
  } catch {
    return apiError(400, 'Invalid params: the multipart body cannot be parsed')
  }
  const file = form.get('file')
  if (!file || typeof file === 'string') return apiError(422, 'file: field required')
  const purpose = form.get('purpose') ?? 'general'
  if (purpose !== 'general' && purpose !== 'assistant')
    return apiError(422, 'purpose: value is not a valid enumeration member')
  if (file.size > MAX_FILE_BYTES) return apiError(413, 'Payload Too Large')
  const mime = (file.type || '').split(';')[0]!.trim().toLowerCase()
  if (!FILE_TYPES.has(mime)) return apiError(415, `Unsupported Media Type: ${mime.slice(0, 40) || '(none)'}`)
  if (file.size === 0) return apiError(422, 'file: the file is empty')
  core.countUpload()
  if (state.files.size >= MAX_STORED_FILES) state.files.delete(state.files.keys().next().value!)
  const stored: StoredFile = {
    id: crypto.randomUUID(),
    object: 'file',
    bytes: file.size,
    created_at: Math.floor(Date.now() / 1000),
    filename: (file as File).name || 'file',
    purpose,
    access_policy: 'private',
  }
  state.files.set(stored.id, { file: stored, image: mime.startsWith('image/') })
  return Response.json(stored)
}

/** The request body, or undefined past `cap` bytes (the rest is not read). */
async function readAtMost(req: Request, cap: number): Promise<Blob | undefined> {
  const reader = req.body?.getReader()
  if (!reader) return new Blob([])
  const parts: Uint8Array[] = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > cap) {
      await reader.cancel().catch(() => {})
      return undefined
    }
    parts.push(value)
  }
  return new Blob(parts as BlobPart[])
}

interface GigaMessage {
  role?: unknown
  content?: unknown
  name?: unknown
  function_call?: { name?: unknown; arguments?: unknown }
  attachments?: unknown
}

/**
 * GigaChat's chat request -> the node's OpenAI request, or a 422 for what GigaChat refuses. A
 * stored image in `attachments` becomes an image part, which the node counts as prompt tokens.
 */
function openAIChat(body: Record<string, unknown>, state: NodeState): Record<string, unknown> | Response {
  if (typeof body.model !== 'string' || body.model === '') return apiError(422, 'model: field required')
  if (!Array.isArray(body.messages) || body.messages.length === 0)
    return apiError(422, 'messages: ensure this value has at least 1 items')
  const messages: Record<string, unknown>[] = []
  let lastCall = ''
  let n = 0
  let images = 0
  for (const [i, m] of (body.messages as GigaMessage[]).entries()) {
    if (!m || typeof m !== 'object') return apiError(422, `messages[${i}]: value is not a valid dict`)
    const content = m.content ?? ''
    if (typeof content !== 'string') return apiError(422, `messages[${i}].content: str type expected`)
    if (m.attachments !== undefined) {
      if (!Array.isArray(m.attachments) || m.attachments.some((a) => typeof a !== 'string'))
        return apiError(422, `messages[${i}].attachments: a list of file ids is expected`)
      if (m.role !== 'user') return apiError(422, `messages[${i}].attachments: only user messages take files`)
    }
    const attachments = (m.attachments ?? []) as string[]
    // (What GigaChat itself answers for an id not in the storage is not documented.)
    for (const id of attachments)
      if (!state.files.has(id)) return apiError(400, `Invalid params: file ${id.slice(0, 64)} not found`)
    const imageCount = attachments.filter((id) => state.files.get(id)!.image).length
    if (imageCount > 1) return apiError(422, `messages[${i}]: only one image per message is supported`)
    images += imageCount
    if (images > MAX_IMAGES) return apiError(422, `at most ${MAX_IMAGES} images per request are supported`)
    if (m.role === 'user' && attachments.length > 0)
      messages.push({
        role: 'user',
        content: [
          { type: 'text', text: content },
          ...attachments.map((id) => ({ type: 'image_url', image_url: { url: `gigachat-file:${id}` } })),
        ],
      })
    else if (m.role === 'system' || m.role === 'user') messages.push({ role: m.role, content })
    else if (m.role === 'assistant') {
      if (m.function_call) {
        lastCall = `call_${++n}`
        messages.push({
          role: 'assistant',
          content: content || null,
          tool_calls: [
            {
              id: lastCall,
              type: 'function',
              function: {
                name: String(m.function_call.name ?? ''),
                arguments: JSON.stringify(m.function_call.arguments ?? {}),
              },
            },
          ],
        })
      } else messages.push({ role: 'assistant', content })
    } else if (m.role === 'function') {
      try {
        JSON.parse(content)
      } catch {
        return apiError(422, `messages[${i}].content: a function result must be valid JSON`)
      }
      messages.push({ role: 'tool', tool_call_id: lastCall || `call_${++n}`, content })
    } else return apiError(422, `messages[${i}].role: value is not a valid enumeration member`)
  }
  const out: Record<string, unknown> = { model: body.model, messages }
  if (typeof body.max_tokens === 'number') out.max_tokens = body.max_tokens
  if (body.temperature !== undefined) {
    // The reference: temperature > 0 (top_p narrows sampling instead).
    if (typeof body.temperature !== 'number' || !(body.temperature > 0) || body.temperature > 2)
      return apiError(422, 'Invalid params: temperature must be greater than 0 and at most 2')
    out.temperature = body.temperature
  }
  if (body.stream === true) {
    out.stream = true
    out.stream_options = { include_usage: true }
  }
  if (body.functions !== undefined) {
    if (!Array.isArray(body.functions)) return apiError(422, 'functions: value is not a valid list')
    const tools: unknown[] = []
    for (const [i, f] of (
      body.functions as { name?: unknown; description?: unknown; parameters?: unknown }[]
    ).entries()) {
      if (typeof f?.name !== 'string' || f.name === '')
        return apiError(422, `functions[${i}].name: field required`)
      if (!f.parameters || typeof f.parameters !== 'object')
        return apiError(422, `functions[${i}].parameters: field required`)
      tools.push({
        type: 'function',
        function: { name: f.name, description: f.description, parameters: f.parameters },
      })
    }
    if (tools.length > 0) out.tools = tools
    const fc = body.function_call
    if (fc === 'none') out.tool_choice = 'none'
    else if (fc && typeof fc === 'object' && typeof (fc as { name?: unknown }).name === 'string')
      out.tool_choice = { type: 'function', function: { name: (fc as { name: string }).name } }
  }
  return out
}

function argumentsObject(args: string): Record<string, unknown> {
  try {
    const v = JSON.parse(args) as unknown
    if (v && typeof v === 'object' && !Array.isArray(v)) return v as Record<string, unknown>
  } catch {
    // below
  }
  return {}
}

const gigaFinish = (r: unknown) => (r === 'tool_calls' ? 'function_call' : r === 'length' ? 'length' : 'stop')

interface OpenAIUsage {
  prompt_tokens: number
  completion_tokens: number
  total_tokens: number
  prompt_tokens_details?: { cached_tokens?: number }
}
const gigaUsage = (u: OpenAIUsage) => ({
  prompt_tokens: u.prompt_tokens,
  completion_tokens: u.completion_tokens,
  total_tokens: u.total_tokens,
  precached_prompt_tokens: u.prompt_tokens_details?.cached_tokens ?? 0,
})

async function chat(
  body: Record<string, unknown>,
  core: SimCore,
  state: NodeState,
  signal: AbortSignal,
): Promise<Response> {
  const openai = openAIChat(body, state)
  if (openai instanceof Response) return openai
  const res = await core.chat(openai, signal)
  if (!res.ok) return apiError(res.status, await failedMessage(res))
  const model = body.model as string
  if (openai.stream === true) return stream(res, model)
  let reply: {
    created: number
    choices: {
      index: number
      message: { content: string | null; tool_calls?: { function: { name: string; arguments: string } }[] }
      finish_reason: string
    }[]
    usage: OpenAIUsage
  }
  try {
    reply = await res.json()
  } catch {
    return broken()
  }
  return Response.json({
    choices: reply.choices.map((c) => {
      const call = c.message.tool_calls?.[0]
      return {
        message: {
          role: 'assistant',
          content: c.message.content ?? '',
          ...(call && {
            function_call: { name: call.function.name, arguments: argumentsObject(call.function.arguments) },
            functions_state_id: crypto.randomUUID(),
          }),
        },
        index: c.index,
        finish_reason: gigaFinish(c.finish_reason),
      }
    }),
    created: reply.created,
    model: `${model}:1.0.26.20`,
    object: 'chat.completion',
    usage: gigaUsage(reply.usage),
  })
}

/**
 * The node's OpenAI SSE as GigaChat's: text deltas as they come; a function call (streamed by
 * OpenAI in argument fragments) whole in the last chunk, which also carries finish_reason and usage.
 */
function stream(res: Response, model: string): Response {
  let name = ''
  let args = ''
  let finish: string | null = null
  let created = Math.floor(Date.now() / 1000)
  const event = (o: unknown) => encoder.encode(`data: ${JSON.stringify(o)}\n\n`)
  const frame = (delta: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
    choices: [{ delta, index: 0, ...extra }],
    created,
    model: `${model}:1.0.26.20`,
    object: 'chat.completion',
  })
  const out = res.body!.pipeThrough(lineSplitter('sim')).pipeThrough(
    new TransformStream<string, Uint8Array>({
      transform(line, controller) {
        if (!line.startsWith('data: ')) return
        const data = line.slice(6)
        if (data === '[DONE]') {
          controller.enqueue(encoder.encode('data: [DONE]\n\n'))
          return
        }
        const chunk = JSON.parse(data) as {
          created?: number
          choices: {
            delta: { content?: string; tool_calls?: { function?: { name?: string; arguments?: string } }[] }
            finish_reason: string | null
          }[]
          usage?: OpenAIUsage
        }
        if (typeof chunk.created === 'number') created = chunk.created
        const c = chunk.choices[0]
        if (c) {
          const fn = c.delta.tool_calls?.[0]?.function
          if (fn?.name) name = fn.name
          if (fn?.arguments) args += fn.arguments
          if (typeof c.delta.content === 'string' && c.delta.content !== '')
            controller.enqueue(event(frame({ content: c.delta.content, role: 'assistant' })))
          if (c.finish_reason) finish = c.finish_reason
        }
        if (chunk.usage) {
          const delta: Record<string, unknown> = { content: '', role: 'assistant' }
          if (name) {
            delta.function_call = { name, arguments: argumentsObject(args) }
            delta.functions_state_id = crypto.randomUUID()
          }
          // GigaChat puts usage at the top level of its last chunk.
          const last = {
            ...frame(delta, { finish_reason: gigaFinish(finish) }),
            usage: gigaUsage(chunk.usage),
          }
          controller.enqueue(event(last))
        }
      },
    }),
  )
  return new Response(out, { headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-store' } })
}

async function embeddings(body: Record<string, unknown>, core: SimCore): Promise<Response> {
  if (typeof body.model !== 'string') return apiError(422, 'model: field required')
  const input = body.input
  if (!Array.isArray(input) || input.length === 0 || input.some((t) => typeof t !== 'string'))
    return apiError(422, 'input: a non-empty list of strings is required')
  const data: unknown[] = []
  for (const [index, text] of (input as string[]).entries()) {
    const res = await core.embeddings({ model: body.model, input: text })
    if (!res.ok) return apiError(res.status, await failedMessage(res))
    const r = (await res.json()) as { data: { embedding: number[] }[]; usage: { prompt_tokens: number } }
    data.push({
      object: 'embedding',
      embedding: r.data[0]!.embedding,
      index,
      usage: { prompt_tokens: r.usage.prompt_tokens },
    })
  }
  return Response.json({ object: 'list', data, model: body.model })
}
