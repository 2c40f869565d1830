#!/usr/bin/env bun
/**
 * llama-node.ts — a minimal OpenAI-compatible inference server around
 * node-llama-cpp (real llama.cpp, CPU) for use as a Tropa upstream in tests.
 *
 *   bun scripts/real-upstream/llama-node.ts --port 18001 --model .real-upstream/tiny.gguf
 *
 * Endpoints
 *   GET  /health                -> 200 {status:"ok", model, load_ms, sequences, busy, queued,
 *                                         requests_total, completion_tokens_total}
 *   GET  /v1/models             -> OpenAI model list (one model, --model-id, default "tiny")
 *   GET  /v1/models/:id
 *   POST /v1/chat/completions   -> non-streaming, or SSE when stream:true
 *        (OpenAI chunk format, `data: [DONE]`, a final usage chunk with
 *        `choices: []` when stream_options.include_usage is true)
 *
 * Usage is real: prompt_tokens are counted by the model's own tokenizer (BOS
 * included), completion_tokens are the tokens actually generated (the end-of-
 * generation token is not counted). max_tokens / max_completion_tokens are
 * honoured (finish_reason "length"); `stop` strings are honoured
 * (finish_reason "stop"); temperature, top_p and seed are passed to the sampler.
 *
 * Concurrency: one llama context with --sequences (default 4) sequences; each
 * request takes a free sequence, excess requests wait in a FIFO queue.
 *
 * node-llama-cpp is resolved from NODE_LLAMA_CPP_DIR (default
 * $REAL_UPSTREAM_DIR/node_modules/node-llama-cpp, REAL_UPSTREAM_DIR defaulting to <repo>/.real-upstream), installed by setup.sh,
 * so the project's own package.json never depends on it.
 *
 * Options
 *   --port N              (default 18001)   --host H (default 127.0.0.1)
 *   --model PATH          GGUF file (default .real-upstream/tiny.gguf)
 *   --model-id ID         model name served (default "tiny")
 *   --any-model           accept any "model" in requests (default: 404 for others)
 *   --sequences N         parallel sequences (default 4)
 *   --threads N           llama.cpp threads per evaluation (default 1; more
 *                         threads than free cores makes it ~30-600x slower)
 *   --context-size N      tokens per sequence (default 2048)
 *   --default-max-tokens N  completion cap when the request gives none (default 256)
 *   --token-delay-ms N    sleep after each generated token (simulate a slow upstream)
 *   --allow-bytes         allow byte-fallback tokens in output (may yield U+FFFD)
 */
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

// ------------------------------------------------------------------ args
const argv = process.argv.slice(2)
function arg(name: string, def?: string): string | undefined {
  const i = argv.indexOf(`--${name}`)
  if (i >= 0 && i + 1 < argv.length) return argv[i + 1]
  return def
}
const flag = (name: string) => argv.includes(`--${name}`)

const here = dirname(fileURLToPath(import.meta.url))
const repoRoot = resolve(here, '..', '..')
const PORT = Number(arg('port', '18001'))
const HOST = arg('host', '127.0.0.1')!
const DIR = process.env.REAL_UPSTREAM_DIR ?? resolve(repoRoot, '.real-upstream')
const MODEL_PATH = resolve(arg('model', resolve(DIR, 'tiny.gguf'))!)
const MODEL_ID = arg('model-id', 'tiny')!
const ANY_MODEL = flag('any-model')
const SEQUENCES = Number(arg('sequences', '4'))
const THREADS = Number(arg('threads', '1'))
const CONTEXT_SIZE = Number(arg('context-size', '2048'))
const DEFAULT_MAX_TOKENS = Number(arg('default-max-tokens', '256'))
const TOKEN_DELAY_MS = Number(arg('token-delay-ms', '0'))
const ALLOW_BYTES = flag('allow-bytes')

const LIB_DIR = process.env.NODE_LLAMA_CPP_DIR ?? resolve(DIR, 'node_modules/node-llama-cpp')

// ------------------------------------------------------------------ load
const tStart = performance.now()
// biome-ignore lint/suspicious/noExplicitAny: the library is loaded from a path at run time
const nlc: any = await import(resolve(LIB_DIR, 'dist/index.js'))
const llama = await nlc.getLlama({
  gpu: false,
  build: 'never',
  logLevel: nlc.LlamaLogLevel.warn,
})
const tLlama = performance.now()
const model = await llama.loadModel({ modelPath: MODEL_PATH, gpuLayers: 0 })
const context = await model.createContext({
  contextSize: CONTEXT_SIZE,
  sequences: SEQUENCES,
  threads: THREADS,
})
const LOAD_MS = performance.now() - tStart
const BINDING_MS = tLlama - tStart
const CREATED = Math.floor(Date.now() / 1000)

// Tokens the sampler must never pick: <unk>, <s>, and (unless --allow-bytes)
// byte-fallback tokens other than newline, so gibberish stays valid UTF-8.
const bias = new nlc.TokenBias(model.tokenizer)
{
  const banned: number[] = []
  const bos = model.tokens.bos as number | null
  if (bos != null) banned.push(bos)
  const tokens: string[] = model.fileInfo?.metadata?.tokenizer?.ggml?.tokens ?? []
  tokens.forEach((piece, id) => {
    if (piece === '<unk>') banned.push(id)
    else if (!ALLOW_BYTES && /^<0x[0-9A-F]{2}>$/.test(piece) && piece !== '<0x0A>') banned.push(id)
  })
  for (const t of banned) bias.set(t, 'never')
}

// -------------------------------------------------------- sequence pool
type Seq = {
  clearHistory(): Promise<void>
  evaluate(tokens: number[], opts?: unknown): AsyncGenerator<number, void, unknown>
  contextSize: number
}
const free: Seq[] = []
for (let i = 0; i < SEQUENCES; i++) free.push(context.getSequence())
const waiters: ((s: Seq) => void)[] = []
let busy = 0
let requestsTotal = 0 // chat completions accepted (for checking load balancing)
let tokensTotal = 0 // completion tokens generated

async function acquire(): Promise<Seq> {
  busy++
  const s = free.pop()
  const seq = s ?? (await new Promise<Seq>((r) => waiters.push(r)))
  await seq.clearHistory()
  return seq
}
function release(seq: Seq) {
  busy--
  const next = waiters.shift()
  if (next) next(seq)
  else free.push(seq)
}

// ------------------------------------------------------------- helpers
function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'content-type': 'application/json' },
  })
}
function oaiError(
  status: number,
  message: string,
  type: string,
  code: string | null = null,
  param: string | null = null,
) {
  return json({ error: { message, type, param, code } }, status)
}

type ChatMessage = { role: string; content?: unknown; name?: string }

function contentText(c: unknown): string {
  if (c == null) return ''
  if (typeof c === 'string') return c
  if (Array.isArray(c)) {
    return c
      .map((p) =>
        p && typeof p === 'object' && (p as { type?: string }).type === 'text'
          ? String((p as { text?: unknown }).text ?? '')
          : '',
      )
      .join('')
  }
  return String(c)
}

/** A trivial chat template: "role: content\n" per message, then "assistant:". */
function renderPrompt(messages: ChatMessage[]): string {
  return `${messages.map((m) => `${m.role}: ${contentText(m.content)}`).join('\n')}\nassistant:`
}

function makeId() {
  return `chatcmpl-${crypto.randomUUID().replaceAll('-', '').slice(0, 24)}`
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

type GenParams = {
  promptTokens: number[]
  maxTokens: number
  temperature: number
  topP?: number
  seed?: number
  stop: string[]
  signal: { aborted: boolean }
  onDelta?: (text: string) => void
}
type GenResult = { text: string; completionTokens: number; finishReason: 'stop' | 'length' }

/** Longest suffix of `text` that is a proper prefix of some stop string. */
function heldBack(text: string, stop: string[]): number {
  let keep = 0
  for (const s of stop) {
    for (let k = Math.min(s.length - 1, text.length); k > keep; k--) {
      if (text.endsWith(s.slice(0, k))) {
        keep = k
        break
      }
    }
  }
  return keep
}

async function generate(p: GenParams): Promise<GenResult> {
  const seq = await acquire()
  const out: number[] = []
  let emitted = 0 // chars of decoded text already delivered
  let finishReason: 'stop' | 'length' = 'stop'
  let text = ''
  try {
    if (p.maxTokens <= 0) return { text: '', completionTokens: 0, finishReason: 'length' }
    const gen = seq.evaluate(p.promptTokens, {
      temperature: p.temperature,
      topP: p.topP,
      seed: p.seed,
      tokenBias: bias,
    })
    for await (const token of gen) {
      if (p.signal.aborted) break
      if (model.isEogToken(token)) {
        finishReason = 'stop'
        break
      }
      out.push(token)
      text = model.detokenize(out)
      // stop strings
      let stopAt = -1
      for (const s of p.stop) {
        const i = text.indexOf(s, Math.max(0, emitted - s.length))
        if (i >= 0 && (stopAt < 0 || i < stopAt)) stopAt = i
      }
      if (stopAt >= 0) {
        text = text.slice(0, stopAt)
        if (p.onDelta && text.length > emitted) p.onDelta(text.slice(emitted))
        emitted = text.length
        finishReason = 'stop'
        break
      }
      // deliver what is safe: no dangling partial UTF-8, no possible stop prefix
      let safe = text.length
      if (text.endsWith('\uFFFD')) safe = text.length - 1
      safe -= heldBack(text.slice(0, safe), p.stop)
      if (p.onDelta && safe > emitted) {
        p.onDelta(text.slice(emitted, safe))
        emitted = safe
      }
      if (out.length >= p.maxTokens) {
        finishReason = 'length'
        break
      }
      if (TOKEN_DELAY_MS > 0) await sleep(TOKEN_DELAY_MS)
    }
    if (p.onDelta && text.length > emitted && !p.signal.aborted) p.onDelta(text.slice(emitted))
    return { text, completionTokens: out.length, finishReason }
  } finally {
    tokensTotal += out.length
    release(seq)
  }
}

// -------------------------------------------------------------- handler
async function chatCompletions(req: Request): Promise<Response> {
  // biome-ignore lint/suspicious/noExplicitAny: request body is validated by hand
  let body: any
  try {
    body = await req.json()
  } catch {
    return oaiError(400, 'Request body is not valid JSON', 'invalid_request_error')
  }
  if (!body || typeof body !== 'object')
    return oaiError(400, 'Body must be an object', 'invalid_request_error')
  if (typeof body.model !== 'string')
    return oaiError(400, "'model' is required", 'invalid_request_error', null, 'model')
  if (!ANY_MODEL && body.model !== MODEL_ID) {
    return oaiError(
      404,
      `The model '${body.model}' does not exist`,
      'invalid_request_error',
      'model_not_found',
      'model',
    )
  }
  if (!Array.isArray(body.messages) || body.messages.length === 0) {
    return oaiError(400, "'messages' must be a non-empty array", 'invalid_request_error', null, 'messages')
  }
  if (body.n != null && body.n !== 1)
    return oaiError(400, 'Only n=1 is supported', 'invalid_request_error', null, 'n')
  const maxReq = body.max_completion_tokens ?? body.max_tokens
  if (maxReq != null && (!Number.isInteger(maxReq) || maxReq < 1)) {
    return oaiError(400, 'max_tokens must be a positive integer', 'invalid_request_error', null, 'max_tokens')
  }
  const stop: string[] = (body.stop == null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop]).filter(
    (s: unknown): s is string => typeof s === 'string' && s.length > 0,
  )

  requestsTotal++
  const prompt = renderPrompt(body.messages as ChatMessage[])
  const promptTokens: number[] = [
    ...(model.tokens.bos != null ? [model.tokens.bos] : []),
    ...model.tokenize(prompt),
  ]
  const room = CONTEXT_SIZE - promptTokens.length
  if (room < 1) {
    return oaiError(
      400,
      `This model's maximum context length is ${CONTEXT_SIZE} tokens; the messages resulted in ${promptTokens.length} tokens.`,
      'invalid_request_error',
      'context_length_exceeded',
      'messages',
    )
  }
  const maxTokens = Math.min(maxReq ?? DEFAULT_MAX_TOKENS, room)
  const temperature = typeof body.temperature === 'number' ? body.temperature : 1
  const topP = typeof body.top_p === 'number' ? body.top_p : undefined
  // like OpenAI, vary output unless the caller pins a seed
  const seed = Number.isInteger(body.seed) ? body.seed : Math.floor(Math.random() * 2 ** 31)
  const id = makeId()
  const created = Math.floor(Date.now() / 1000)
  const modelName = body.model as string

  const usageOf = (r: GenResult) => ({
    prompt_tokens: promptTokens.length,
    completion_tokens: r.completionTokens,
    total_tokens: promptTokens.length + r.completionTokens,
  })

  if (!body.stream) {
    const signal = { aborted: false }
    req.signal?.addEventListener('abort', () => {
      signal.aborted = true
    })
    const r = await generate({ promptTokens, maxTokens, temperature, topP, seed, stop, signal })
    return json({
      id,
      object: 'chat.completion',
      created,
      model: modelName,
      system_fingerprint: 'llama-node',
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: r.text, refusal: null },
          logprobs: null,
          finish_reason: r.finishReason,
        },
      ],
      usage: usageOf(r),
    })
  }

  const includeUsage = body.stream_options?.include_usage === true
  const enc = new TextEncoder()
  const signal = { aborted: false }
  const base = {
    id,
    object: 'chat.completion.chunk',
    created,
    model: modelName,
    system_fingerprint: 'llama-node',
  }
  const stream = new ReadableStream<Uint8Array>({
    async start(controller) {
      const send = (obj: unknown) => {
        if (signal.aborted) return
        try {
          controller.enqueue(enc.encode(`data: ${JSON.stringify(obj)}\n\n`))
        } catch {
          signal.aborted = true
        }
      }
      const chunk = (delta: object, finish: string | null) => ({
        ...base,
        choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
        ...(includeUsage ? { usage: null } : {}),
      })
      try {
        send(chunk({ role: 'assistant', content: '', refusal: null }, null))
        const r = await generate({
          promptTokens,
          maxTokens,
          temperature,
          topP,
          seed,
          stop,
          signal,
          onDelta: (t) => send(chunk({ content: t }, null)),
        })
        send(chunk({}, r.finishReason))
        if (includeUsage) send({ ...base, choices: [], usage: usageOf(r) })
        if (!signal.aborted) controller.enqueue(enc.encode('data: [DONE]\n\n'))
      } catch (e) {
        send({
          error: {
            message: String((e as Error)?.message ?? e),
            type: 'server_error',
            param: null,
            code: null,
          },
        })
      } finally {
        try {
          controller.close()
        } catch {}
      }
    },
    cancel() {
      signal.aborted = true
    },
  })
  req.signal?.addEventListener('abort', () => {
    signal.aborted = true
  })
  return new Response(stream, {
    headers: {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
    },
  })
}

const modelObj = () => ({ id: MODEL_ID, object: 'model', created: CREATED, owned_by: 'llama-node' })

const server = Bun.serve({
  port: PORT,
  hostname: HOST,
  idleTimeout: 0,
  async fetch(req) {
    const url = new URL(req.url)
    const path = url.pathname.replace(/\/+$/, '')
    try {
      if (req.method === 'GET' && path === '/health') {
        return json({
          status: 'ok',
          model: MODEL_ID,
          load_ms: Math.round(LOAD_MS),
          binding_ms: Math.round(BINDING_MS),
          sequences: SEQUENCES,
          busy,
          queued: waiters.length,
          context_size: CONTEXT_SIZE,
          requests_total: requestsTotal,
          completion_tokens_total: tokensTotal,
        })
      }
      if (req.method === 'GET' && path === '/v1/models') return json({ object: 'list', data: [modelObj()] })
      if (req.method === 'GET' && path.startsWith('/v1/models/')) {
        const id = decodeURIComponent(path.slice('/v1/models/'.length))
        if (id === MODEL_ID || ANY_MODEL) return json({ ...modelObj(), id })
        return oaiError(
          404,
          `The model '${id}' does not exist`,
          'invalid_request_error',
          'model_not_found',
          'model',
        )
      }
      if (path === '/v1/chat/completions') {
        if (req.method !== 'POST') return oaiError(405, 'Method not allowed', 'invalid_request_error')
        return await chatCompletions(req)
      }
      return oaiError(404, `Unknown path ${url.pathname}`, 'invalid_request_error', 'not_found')
    } catch (e) {
      return oaiError(500, String((e as Error)?.message ?? e), 'server_error')
    }
  },
})

console.log(
  `llama-node listening on http://${HOST}:${server.port} model=${MODEL_ID} file=${MODEL_PATH} load_ms=${LOAD_MS.toFixed(0)} sequences=${SEQUENCES} threads=${THREADS}`,
)

let stopping = false
async function shutdown() {
  if (stopping) return
  stopping = true
  server.stop(true)
  try {
    await context.dispose()
    await model.dispose()
    await llama.dispose()
  } catch {}
  process.exit(0)
}
process.on('SIGINT', shutdown)
process.on('SIGTERM', shutdown)
