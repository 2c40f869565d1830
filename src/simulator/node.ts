import { loadTokenizer } from '../tokenizer.ts'
import { type Handlers, legacyCompletion, type SimRun } from './completions.ts'
import { Engine, fnv1a, promptBlockHashes } from './engine.ts'
import { PROTOCOLS, type SimCore, type SimProtocol } from './protocols/index.ts'
import { inputTokens, renderPrompt } from './render.ts'
import { prng, toolArguments, words } from './text.ts'

export interface SimFaults {
  /** Fraction of requests answered 500. */
  errorRate: number
  /** Fraction answered 429 (with retry-after: 1). */
  rate429: number
  /** Fraction answered 503. */
  rate503: number
  /** Accept requests and never answer until the client goes away. */
  hang: boolean
  /** Break the connection after this many content tokens (no [DONE]). */
  cutAfterTokens: number | null
  /** Multiplies every engine timing. */
  slowdownFactor: number
  /**
   * A stall, as when vLLM's engine core hangs: requests are accepted and nothing is answered
   * (no tokens, no errors), /metrics stays frozen at its last values, /v1/models still answers;
   * once cleared the engine carries on where it stopped, late by the stall's length.
   */
  stall: boolean
}

export interface SimNodeOptions {
  name: string
  port?: number
  hostname?: string
  prefillTokensPerSec?: number
  itlMs?: number
  iterationOverheadMs?: number
  maxSeqs?: number
  prefillBudgetTokens?: number
  /** Extra decode time per running sequence (default itlMs / 20). */
  decodeMsPerSeq?: number
  cacheBlocks?: number
  embeddingDims?: number
  /** Multiplies every delay; 0 answers at once (fast tests). */
  timeScale?: number
  seed?: number
  /** Every answer runs to its max_tokens (vLLM's ignore_eos): long outputs on demand. */
  ignoreEos?: boolean
  /**
   * Benchmarks only: every streamed chunk carries `"x_sent_ms"`, the wall-clock ms (to the µs) at
   * which the node handed it to its stream, so a client can tell what a proxy added to each token.
   */
  stampChunks?: boolean
  /** The API the node speaks (default openai); see protocols/index.ts. */
  protocol?: SimProtocol
  /** vLLM's `--scheduling-policy priority`: requests may carry `priority` (else a non-zero one is a 400). */
  priorityScheduling?: boolean
  /** How long the access tokens of a protocol with a token exchange (gigachat) live (default 30 min). */
  tokenLifetimeMs?: number
  faults?: Partial<SimFaults>
}

export interface SimNodeStats {
  requests: number
  chatRequests: number
  /** Legacy completions (POST /v1/completions). */
  completionRequests: number
  embeddingRequests: number
  streams: number
  aborted: number
  promptTokens: number
  completionTokens: number
  cachedTokens: number
  /** Token exchanges answered (gigachat's OAuth endpoint). */
  authRequests: number
  /** Files stored (gigachat's POST /files). */
  uploads: number
  running: number
  waiting: number
  /** Chat requests that carried a priority after the default (batch lines on a priority route). */
  lowPriorityRequests: number
}

export interface SimNode {
  readonly name: string
  readonly port: number
  /** Base URL including /v1. */
  readonly url: string
  setFaults(f: Partial<SimFaults>): void
  stats(): SimNodeStats
  resetStats(): void
  stop(): Promise<void>
}

const NO_FAULTS: SimFaults = {
  errorRate: 0,
  rate429: 0,
  rate503: 0,
  hang: false,
  cutAfterTokens: null,
  slowdownFactor: 1,
  stall: false,
}
const encoder = new TextEncoder()
const METRICS_HEADERS = { 'content-type': 'text/plain; version=0.0.4' }
const SSE_HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' }

interface ChatBody {
  model?: unknown
  messages?: unknown
  stream?: unknown
  stream_options?: { include_usage?: unknown } | null
  max_tokens?: unknown
  max_completion_tokens?: unknown
  seed?: unknown
  priority?: unknown
  tools?: { function?: { name?: string; parameters?: unknown } }[]
  tool_choice?: unknown
}

/** One simulated OpenAI-compatible inference server on its own port. */
export async function startSimNode(opts: SimNodeOptions): Promise<SimNode> {
  const timeScale = opts.timeScale ?? 1
  const engine = new Engine({
    prefillTokensPerSec: opts.prefillTokensPerSec ?? 8000,
    itlMs: opts.itlMs ?? 20,
    iterationOverheadMs: opts.iterationOverheadMs ?? 1,
    maxSeqs: opts.maxSeqs ?? 32,
    prefillBudgetTokens: opts.prefillBudgetTokens ?? 2048,
    cacheBlocks: opts.cacheBlocks ?? 4096,
    ...(opts.decodeMsPerSeq !== undefined && { decodeMsPerSeq: opts.decodeMsPerSeq }),
    ...(opts.priorityScheduling && { priorityScheduling: true }),
  })
  const embeddingDims = opts.embeddingDims ?? 256
  let faults: SimFaults = { ...NO_FAULTS, ...opts.faults }
  engine.setSlowdown(faults.slowdownFactor)
  const faultRand = prng((opts.seed ?? 0) ^ 0x5eed)
  const stats: SimNodeStats = emptyStats()
  const handlers = new Map<string, Handlers>()
  const t0 = performance.now()
  /** While stalled: since when (wall ms), and the /metrics page frozen then. */
  let stalledAt: number | undefined
  let frozenMetrics: string | undefined
  /** Wall time spent stalled: the engine's clock stands still meanwhile. */
  let stalledMs = 0
  const engineNow = () =>
    timeScale === 0 ? 0 : ((stalledAt ?? performance.now()) - t0 - stalledMs) / timeScale
  let timer: ReturnType<typeof setTimeout> | undefined
  let seq = 0
  let cacheHits = 0
  let cacheQueries = 0

  const arm = () => {
    if (timer) clearTimeout(timer)
    timer = undefined
    if (stalledAt !== undefined) return // resumes when the stall ends
    const next = engine.nextEventAt()
    if (next === undefined) return
    timer = setTimeout(tick, Math.max(0, (next - engineNow()) * timeScale))
  }
  const tick = () => {
    timer = undefined
    for (const e of engine.advance(engineNow())) {
      const h = handlers.get(e.id)
      if (!h) continue
      if (e.kind === 'first_token') h.first(e.cachedTokens)
      else if (e.kind === 'token') h.token(e.index)
      else {
        handlers.delete(e.id)
        h.done()
      }
    }
    arm()
  }

  /** Runs a generation: in the engine with real timers, or at once when timeScale is 0. */
  const generate = (
    blocks: string[],
    promptTokens: number,
    outputTokens: number,
    h: Handlers,
    signal: AbortSignal,
    priority = 0,
  ) => {
    const id = `r${++seq}`
    cacheQueries++
    if (timeScale === 0) {
      const cached = engine.lookupPrefix(blocks, promptTokens)
      engine.insertBlocks(blocks)
      if (cached > 0) cacheHits++
      h.first(cached)
      for (let i = 1; i < outputTokens && !signal.aborted; i++) h.token(i)
      if (!signal.aborted) h.done()
      return
    }
    handlers.set(id, {
      ...h,
      first: (cached) => {
        if (cached > 0) cacheHits++
        h.first(cached)
      },
    })
    signal.addEventListener('abort', () => {
      if (!handlers.delete(id)) return
      engine.cancel(id, engineNow())
      arm()
    })
    engine.submit({ id, promptBlocks: blocks, promptTokens, outputTokens, priority }, engineNow())
    arm()
  }

  const fault = (): Response | undefined => {
    const r = faultRand()
    if (r < faults.errorRate) return errorResponse(500, 'simulated internal error', 'server_error')
    if (r < faults.errorRate + faults.rate429)
      return errorResponse(429, 'simulated rate limit', 'rate_limit_error', { 'retry-after': '1' })
    if (r < faults.errorRate + faults.rate429 + faults.rate503)
      return errorResponse(503, 'simulated overload', 'server_error')
    return undefined
  }

  const chat = (body: ChatBody, signal: AbortSignal): Response | Promise<Response> => {
    if (typeof body.model !== 'string')
      return errorResponse(400, 'model is required', 'invalid_request_error')
    if (!Array.isArray(body.messages) || body.messages.length === 0)
      return errorResponse(400, 'messages must be a non-empty array', 'invalid_request_error')
    const priority = body.priority ?? 0
    if (typeof priority !== 'number' || !Number.isInteger(priority))
      return errorResponse(400, 'priority must be an integer', 'invalid_request_error')
    // As vLLM answers a priority it cannot honour.
    if (priority !== 0 && !opts.priorityScheduling)
      return errorResponse(
        400,
        `Got priority ${priority} but Priority scheduling is not enabled.`,
        'invalid_request_error',
      )
    stats.chatRequests++
    if (priority > 0) stats.lowPriorityRequests++
    const messages = body.messages as { role?: unknown }[]
    const prompt = renderPrompt(messages)
    const blocks = promptBlockHashes(body.model, prompt.tokens)
    const seedPart = typeof body.seed === 'number' ? body.seed : 0
    // Text depends on the request only, so every node answers the same seed alike.
    const rand = prng(fnv1a(`${seedPart}:${prompt.tokens.length}:${prompt.tokens.slice(-64).join(',')}`))
    const cap = numberOr(body.max_completion_tokens, numberOr(body.max_tokens, Number.POSITIVE_INFINITY))
    const tools = Array.isArray(body.tools) ? body.tools : []
    const last = messages[messages.length - 1]
    const toolCall = tools.length > 0 && body.tool_choice !== 'none' && last?.role !== 'tool'
    const drawn = 8 + Math.floor(rand() * 57)
    const toEos = opts.ignoreEos === true && Number.isFinite(cap)
    const wanted = toEos ? cap : drawn
    const n = Math.max(1, Math.min(wanted, cap))
    const finish = toolCall ? 'tool_calls' : n < wanted || toEos ? 'length' : 'stop'
    let call: { id: string; name: string; args: string } | undefined
    if (toolCall) {
      const chosen = (body.tool_choice as { function?: { name?: string } } | undefined)?.function?.name
      const tool = tools.find((t) => t.function?.name === chosen) ?? tools[0]!
      call = {
        id: `call_${Math.floor(rand() * 1e12).toString(36)}`,
        name: tool.function?.name ?? 'tool',
        args: toolArguments(tool.function?.parameters),
      }
    }
    const text = call ? [] : words(rand, n)
    // A tool call's "tokens" are its argument fragments, streamed like OpenAI's.
    const pieces = call ? splitArgs(call.args) : text
    const outputTokens = pieces.length
    const id = `chatcmpl-sim${++seq}`
    const created = Math.floor(Date.now() / 1000)
    const model = body.model
    stats.promptTokens += prompt.count
    const usage = (cached: number) => ({
      prompt_tokens: prompt.count,
      completion_tokens: outputTokens,
      total_tokens: prompt.count + outputTokens,
      prompt_tokens_details: { cached_tokens: cached },
    })
    const cut = faults.cutAfterTokens

    if (body.stream !== true) {
      return new Promise<Response>((resolve) => {
        let cached = 0
        generate(
          blocks,
          prompt.count,
          outputTokens,
          {
            first: (c) => {
              cached = c
            },
            token: () => {},
            done: () => {
              stats.completionTokens += outputTokens
              stats.cachedTokens += cached
              if (cut !== null) return resolve(brokenResponse())
              const message = call
                ? {
                    role: 'assistant',
                    content: null,
                    tool_calls: [
                      { id: call.id, type: 'function', function: { name: call.name, arguments: call.args } },
                    ],
                  }
                : { role: 'assistant', content: text.join('').trimStart() }
              resolve(
                Response.json({
                  id,
                  object: 'chat.completion',
                  created,
                  model,
                  choices: [{ index: 0, message, logprobs: null, finish_reason: finish }],
                  usage: usage(cached),
                }),
              )
            },
          },
          signal,
          priority,
        )
      })
    }

    stats.streams++
    const head = `{"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)}`
    const includeUsage = body.stream_options?.include_usage === true
    /** `,"x_sent_ms":<now>` on stamping nodes: the time this chunk is handed to the stream. */
    const stamp = () =>
      opts.stampChunks === true
        ? `,"x_sent_ms":${(performance.timeOrigin + performance.now()).toFixed(3)}`
        : ''
    const chunk = (delta: string, finishReason: string | null) =>
      `data: ${head}${stamp()},"choices":[{"index":0,"delta":${delta},"logprobs":null,"finish_reason":${finishReason ? `"${finishReason}"` : 'null'}}]}\n\n`
    const piece = (i: number) => {
      const p = pieces[i]!
      if (!call) return chunk(`{"content":${JSON.stringify(p)}}`, null)
      const fn =
        i === 0
          ? `{"name":${JSON.stringify(call.name)},"arguments":${JSON.stringify(p)}}`
          : `{"arguments":${JSON.stringify(p)}}`
      return chunk(
        `{"tool_calls":[{"index":0,${i === 0 ? `"id":"${call.id}","type":"function",` : ''}"function":${fn}}]}`,
        null,
      )
    }
    let controller!: ReadableStreamDefaultController<Uint8Array>
    let closed = false
    let sent = 0
    let cached = 0
    const send = (text: string) => {
      if (!closed) controller.enqueue(encoder.encode(text))
    }
    const emit = (i: number) => {
      if (closed) return
      if (cut !== null && sent >= cut) {
        closed = true
        // Erroring a stream drops what is still queued in it: the cut comes once the tokens
        // already generated are handed to the socket, as a real node dies after what it wrote,
        // and 20 ms later, so that they have reached the client too (a reset arriving with them
        // can discard them from its receive buffer: a test saw 2 of 3 once).
        const die = () => {
          if ((controller.desiredSize ?? 1) < 1) setTimeout(die, 1)
          else
            setTimeout(() => {
              try {
                controller.error(new Error('simulated cut'))
              } catch {} // the client left first: nothing to cut
            }, 20)
        }
        die()
        return
      }
      send(piece(i))
      sent++
    }
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        controller = c
      },
      cancel() {
        closed = true
      },
    })
    generate(
      blocks,
      prompt.count,
      outputTokens,
      {
        first: (c) => {
          cached = c
          send(chunk('{"role":"assistant","content":""}', null))
          emit(0)
        },
        token: (i) => emit(i),
        done: () => {
          if (closed) return
          stats.completionTokens += outputTokens
          stats.cachedTokens += cached
          send(chunk('{}', finish))
          if (includeUsage) send(`data: ${head},"choices":[],"usage":${JSON.stringify(usage(cached))}}\n\n`)
          send('data: [DONE]\n\n')
          closed = true
          controller.close()
        },
      },
      signal,
      priority,
    )
    return new Response(stream, { headers: SSE_HEADERS })
  }

  const legacy: Omit<SimRun, 'cutAfterTokens'> = {
    generate,
    stats,
    ignoreEos: opts.ignoreEos === true,
    nextSeq: () => ++seq,
  }

  const embeddings = (body: {
    model?: unknown
    input?: unknown
    dimensions?: unknown
    encoding_format?: unknown
  }) => {
    if (typeof body.model !== 'string')
      return errorResponse(400, 'model is required', 'invalid_request_error')
    const input = body.input
    const items: unknown[] =
      typeof input === 'string'
        ? [input]
        : Array.isArray(input)
          ? typeof input[0] === 'number'
            ? [input]
            : input
          : []
    if (items.length === 0) return errorResponse(400, 'input is required', 'invalid_request_error')
    const dims = body.dimensions === undefined ? embeddingDims : body.dimensions
    if (typeof dims !== 'number' || !Number.isInteger(dims) || dims < 1 || dims > embeddingDims)
      return errorResponse(400, `dimensions must be 1..${embeddingDims}`, 'invalid_request_error')
    stats.embeddingRequests++
    let tokens = 0
    const data = items.map((item, index) => {
      tokens += inputTokens(item)
      const v = unitVector(typeof item === 'string' ? item : JSON.stringify(item), dims)
      const embedding =
        body.encoding_format === 'base64' ? Buffer.from(v.buffer).toString('base64') : Array.from(v)
      return { object: 'embedding', index, embedding }
    })
    stats.promptTokens += tokens
    return Response.json({
      object: 'list',
      data,
      model: body.model,
      usage: { prompt_tokens: tokens, total_tokens: tokens },
    })
  }

  const metrics = () => new Response(frozenMetrics ?? metricsText(), { headers: METRICS_HEADERS })
  const metricsText = () => {
    const label = `{model_name="sim"}`
    const lines = [
      '# TYPE vllm:num_requests_running gauge',
      `vllm:num_requests_running${label} ${timeScale === 0 ? 0 : engine.running()}`,
      '# TYPE vllm:num_requests_waiting gauge',
      `vllm:num_requests_waiting${label} ${timeScale === 0 ? 0 : engine.waiting()}`,
      '# TYPE vllm:gpu_cache_usage_perc gauge',
      `vllm:gpu_cache_usage_perc${label} ${engine.kvUsage()}`,
      '# TYPE vllm:prefix_cache_hits_total counter',
      `vllm:prefix_cache_hits_total${label} ${cacheHits}`,
      '# TYPE vllm:prefix_cache_queries_total counter',
      `vllm:prefix_cache_queries_total${label} ${cacheQueries}`,
      '# TYPE vllm:cache_config_info gauge',
      `vllm:cache_config_info{block_size="${engine.blockSize}",num_gpu_blocks="${opts.cacheBlocks ?? 4096}"} 1.0`,
    ]
    return `${lines.join('\n')}\n`
  }
  const setStall = (on: boolean) => {
    if (on && stalledAt === undefined) {
      frozenMetrics = metricsText()
      stalledAt = performance.now()
      if (timer) clearTimeout(timer)
      timer = undefined
    } else if (!on && stalledAt !== undefined) {
      stalledMs += performance.now() - stalledAt
      stalledAt = undefined
      frozenMetrics = undefined
      arm()
    }
  }
  setStall(faults.stall)

  const protocol = opts.protocol ?? 'openai'
  const front = protocol === 'openai' ? undefined : PROTOCOLS[protocol]
  if (protocol !== 'openai' && !front) throw new Error(`the simulator has no ${protocol} protocol`)
  const core: SimCore = {
    chat: async (body, signal) => {
      stats.requests++
      await loadTokenizer()
      return chat(body as ChatBody, signal)
    },
    embeddings: async (body) => {
      stats.requests++
      await loadTokenizer()
      return embeddings(body as never)
    },
    fault,
    tokenLifetimeMs: opts.tokenLifetimeMs ?? 30 * 60_000,
    countAuthRequest: () => {
      stats.authRequests++
    },
    countUpload: () => {
      stats.uploads++
    },
  }

  const server = Bun.serve({
    port: opts.port ?? 0,
    hostname: opts.hostname ?? '127.0.0.1',
    // A hanging node must hang until the client gives up, not until Bun's idle timeout.
    idleTimeout: 0,
    async fetch(req) {
      // A hung node hangs on every path of every protocol (health, metrics, token exchange
      // included) until the client goes away; a POST counts as a request and its end as aborted.
      if (faults.hang) {
        if (req.method === 'POST') {
          stats.requests++
          req.signal.addEventListener('abort', () => stats.aborted++, { once: true })
        }
        if (req.signal.aborted) return new Response(null, { status: 499 })
        return new Promise<Response>((resolve) =>
          req.signal.addEventListener('abort', () => resolve(new Response(null, { status: 499 })), {
            once: true,
          }),
        )
      }
      if (front) return front(req, core)
      const path = new URL(req.url).pathname
      if (req.method === 'GET') {
        if (path === '/health') return new Response('ok')
        if (path === '/metrics') return metrics()
        if (path === '/v1/models')
          return Response.json({
            object: 'list',
            data: ['chat-small', 'embed-small'].map((id) => ({
              id,
              object: 'model',
              created: 1_767_225_600,
              owned_by: 'sim',
            })),
          })
        return errorResponse(404, `no route ${path}`, 'invalid_request_error')
      }
      if (
        req.method !== 'POST' ||
        (path !== '/v1/chat/completions' && path !== '/v1/completions' && path !== '/v1/embeddings')
      )
        return errorResponse(404, `no route ${req.method} ${path}`, 'invalid_request_error')
      stats.requests++
      req.signal.addEventListener('abort', () => stats.aborted++, { once: true })
      const failed = fault()
      if (failed) return failed
      let body: unknown
      try {
        body = await req.json()
      } catch {
        return errorResponse(400, 'invalid JSON', 'invalid_request_error')
      }
      if (!body || typeof body !== 'object')
        return errorResponse(400, 'body must be an object', 'invalid_request_error')
      await loadTokenizer()
      if (path === '/v1/completions')
        return legacyCompletion(body, req.signal, { ...legacy, cutAfterTokens: faults.cutAfterTokens })
      return path === '/v1/chat/completions' ? chat(body as ChatBody, req.signal) : embeddings(body as never)
    },
  })

  return {
    name: opts.name,
    port: server.port!,
    url: `http://${opts.hostname ?? '127.0.0.1'}:${server.port}/v1`,
    setFaults(f) {
      faults = { ...faults, ...f }
      engine.setSlowdown(faults.slowdownFactor)
      setStall(faults.stall)
    },
    stats: () => ({ ...stats, running: engine.running(), waiting: engine.waiting() }),
    resetStats() {
      Object.assign(stats, emptyStats())
    },
    async stop() {
      if (timer) clearTimeout(timer)
      await server.stop(true)
    },
  }
}

function emptyStats(): SimNodeStats {
  return {
    requests: 0,
    chatRequests: 0,
    completionRequests: 0,
    embeddingRequests: 0,
    streams: 0,
    aborted: 0,
    lowPriorityRequests: 0,
    promptTokens: 0,
    completionTokens: 0,
    cachedTokens: 0,
    authRequests: 0,
    uploads: 0,
    running: 0,
    waiting: 0,
  }
}

function numberOr(v: unknown, fallback: number): number {
  return typeof v === 'number' && Number.isFinite(v) ? v : fallback
}

function errorResponse(status: number, message: string, type: string, headers: Record<string, string> = {}) {
  return Response.json({ error: { message, type, param: null, code: null } }, { status, headers })
}

/** A 200 whose body breaks at once: the connection dies with no complete response. */
function brokenResponse(): Response {
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

/** Argument text in fragments of a few characters, as a model streams them. */
function splitArgs(args: string): string[] {
  const out: string[] = []
  for (let i = 0; i < args.length; i += 4) out.push(args.slice(i, i + 4))
  return out.length > 0 ? out : ['']
}

/** A deterministic L2-normalised vector for a text. */
function unitVector(text: string, dims: number): Float32Array {
  const rand = prng(fnv1a(text))
  const v = new Float32Array(dims)
  let norm = 0
  for (let i = 0; i < dims; i++) {
    const x = rand() * 2 - 1
    v[i] = x
    norm += x * x
  }
  norm = Math.sqrt(norm) || 1
  for (let i = 0; i < dims; i++) v[i] = v[i]! / norm
  return v
}
