import type { ChatMessage, ChatRequest } from '../api/chat.ts'
import type { ConcurrencyLimiter, Slot } from '../billing/concurrency.ts'
import type { MoneyMeter, Reservation, Settlement } from '../billing/meter.ts'
import { costNano, formatRub, type NanoRub, nanoToRubNumber } from '../billing/money.ts'
import { hasRateLimits, type RateLimiter } from '../billing/rate-limiter.ts'
import type { Receipts } from '../billing/receipt-keys.ts'
import { RECEIPT_HEADER, receiptCount } from '../billing/receipts.ts'
import type { Catalogue } from '../catalogue/catalogue.ts'
import type { ModelConfig, RouteConfig } from '../config/load.ts'
import {
  ContextLengthExceeded,
  InternalError,
  InvalidValue,
  modelNotAllowed,
  ServerShuttingDown,
  TropaError,
  UpstreamFailed,
  UpstreamTimeout,
} from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { RequestRecord } from '../metrics/record.ts'
import type { Telemetry } from '../metrics/telemetry.ts'
import type { Candidate } from '../routing/nodes.ts'
import type { Attempt } from '../routing/policy.ts'
import { fail, type RequestTrace } from '../tracing/span.ts'
import { type BodyReader, replyReader, type UpstreamReply } from '../upstream/adapter.ts'
import {
  CHAT_STREAM,
  ChatStreamRelay,
  ERROR_EVENT,
  estimatedUsage,
  type StreamShape,
  sanitizeUsage,
  sseEvent,
  type Usage,
} from '../upstream/sse.ts'
import type { Deadline } from '../upstream/watchdog.ts'
import { type Dispatched, dispatch, finishAttempt, readBody, type UpstreamDeps } from './dispatch.ts'
import type { OpenStreams } from './drain.ts'
import { chatPrefix, NO_PREFIX, type PromptPrefix } from './prefix.ts'
import { quoteCall } from './quote.ts'
import {
  COUNT_SLICE_CHARS,
  countChatPromptLive,
  countTokens,
  countTokensYielding,
  loadTokenizer,
  reservedPromptTokens,
  tokenizerReady,
} from './tokens.ts'

export interface ChatDeps extends UpstreamDeps {
  readonly catalogue: Catalogue
  readonly meter: MoneyMeter
  readonly limiter: RateLimiter
  /** Keys' max_concurrency: requests in flight at once. */
  readonly concurrency: ConcurrencyLimiter
  /** A stream whose client takes no bytes for this long is cut (server.stream_write_timeout_ms). */
  readonly streamWriteTimeoutMs: number
  /** Each request's record (metrics, access log), found by its request id. */
  readonly telemetry: Telemetry
  /** A stream with no first token this long after it began is kept alive with SSE comments; 0: off. */
  readonly sseKeepAliveMs: number
  /** The streams open now (a graceful stop ends those left at its deadline). */
  readonly streams: OpenStreams
  /** Receipt keys (each ledger row records its kid) and, with receipts.responses, the signer of answers; undefined when receipts.enabled is false. */
  readonly receipts?: Receipts | undefined
}

/** Who pays for a request. */
export interface Payer {
  readonly key: LiveKey
  readonly org: LiveOrg
  /**
   * `x-tropa-dry-run: 1`: answer a quote (pipeline/quote.ts) in place of the call: nothing is
   * reserved, charged or sent upstream.
   */
  readonly quoteOnly?: boolean
  /**
   * The key owner's end user the request names (`x-tropa-end-user`, else the body's `user`):
   * recorded in the ledger, and limited by the key's `end_user_budget`.
   */
  readonly endUser?: string
  /**
   * `x-tropa-ttft-budget-ms`: the first token is wanted within this many ms. When no node is
   * predicted to make it the request is refused at once (429, retry-after), before any node sees it.
   */
  readonly ttftBudgetMs?: number
}

/** A completion as JSON (chat's or the legacy endpoint's): the fields Tropa reads or rewrites. */
export interface ChatCompletion {
  id: string
  model: string
  usage?: Usage
  [k: string]: unknown
}

/** Header naming the model first asked for, on an answer a fallback model gave. */
export const FALLBACK_HEADER = 'x-tropa-fallback-from'

/**
 * POST /v1/chat/completions with fallbacks across models: the request's `models` (OpenRouter's
 * form) after `model`, else the model's configured `fallbacks`.
 */
export function chatCompletion(
  deps: ChatDeps,
  payer: Payer,
  request: ChatRequest,
  signal: AbortSignal,
  requestId: string,
  sessionHint?: string,
  /** Closes the client's connection soon (a stream whose client stopped reading is dropped). */
  cut?: () => void,
  /** The request's trace (tracing on). */
  trace?: RequestTrace,
): Promise<Response> {
  let chain: readonly string[]
  try {
    chain = fallbackChain(deps.catalogue, request.model, request.models)
    // A fallback the key may not use is passed over (the model asked for is refused with 403).
    if (chain.length > 1 && payer.key.models !== null)
      chain = chain.filter((id, i) => i === 0 || payer.key.allows(id))
  } catch (err) {
    return Promise.reject(err)
  }
  // `models` is Tropa's own field, never sent upstream. The pass-through path (no fallbacks) goes
  // straight to chatWithModel, with no copy of the body and no promise in between.
  const body: Omit<ChatRequest, 'models'> = request.models === undefined ? request : withoutModels(request)
  if (chain.length === 1) return chatWithModel(deps, payer, body, signal, requestId, sessionHint, cut, trace)
  return withFallbacks(deps, chain, signal, requestId, (model) =>
    chatWithModel(
      deps,
      payer,
      model === body.model ? body : { ...body, model },
      signal,
      requestId,
      sessionHint,
      cut,
      trace,
    ),
  )
}

function withoutModels({ models: _, ...body }: ChatRequest): Omit<ChatRequest, 'models'> {
  return body
}

/**
 * Runs `run` on each model of `chain` in turn. The next model is tried only when every node of
 * the one before failed or was unavailable before anything reached the client, never on the
 * client's own error; each model is reserved for and billed at its own price, so a chain stops at
 * the key's or the organization's limit (402). An answer a fallback gave names the first model in
 * FALLBACK_HEADER.
 */
export async function withFallbacks(
  deps: ChatDeps,
  chain: readonly string[],
  signal: AbortSignal,
  requestId: string,
  run: (model: string) => Promise<Response>,
): Promise<Response> {
  for (let i = 0; ; i++) {
    try {
      const res = await run(chain[i]!)
      if (i > 0) res.headers.set(FALLBACK_HEADER, chain[0]!)
      return res
    } catch (err) {
      // UpstreamFailed: every node failed, timed out or was unavailable (UpstreamRejected, the
      // request refused by the upstream itself, is the client's error and is not one).
      if (i + 1 >= chain.length || !(err instanceof UpstreamFailed) || signal.aborted) throw err
      deps.log('warn', 'model failed; trying its fallback', {
        requestId,
        model: chain[i],
        fallback: chain[i + 1],
        error: (err as Error).message,
      })
    }
  }
}

/**
 * The models to try in order: the one asked for, then the request's or the config's fallbacks;
 * each checked to be a chat model of the catalogue before anything is tried (404, 400).
 */
export function fallbackChain(
  catalogue: Catalogue,
  first: string,
  asked: readonly string[] | undefined,
): readonly string[] {
  const rest = asked ?? catalogue.getOfKind(first, 'chat').fallbacks
  if (rest.length === 0) return [first]
  const chain = [...new Set([first, ...rest])]
  for (const id of chain) catalogue.getOfKind(id, 'chat')
  return chain
}

/** One chat request on one model: checked and counted here, then the shared lifecycle. */
export async function chatWithModel(
  deps: ChatDeps,
  payer: Payer,
  body: Omit<ChatRequest, 'models'>,
  signal: AbortSignal,
  requestId: string,
  sessionHint?: string,
  cut?: () => void,
  trace?: RequestTrace,
): Promise<Response> {
  const startedAtMs = Date.now()
  const model = deps.catalogue.getOfKind(body.model, 'chat')
  checkMessages(body.messages)
  if (!tokenizerReady()) await loadTokenizer()
  const counted = countChatPromptLive(body.messages, body.tools, model.contextLength, payer.org.id)
  const promptTokens = typeof counted === 'number' ? counted : await counted
  const maxOut = outputBudget(model, promptTokens, askedOutput(body))
  const stream = body.stream === true
  // Only include_usage is forwarded in stream_options (billing reads the usage, and an option
  // such as continuous_usage_stats changes what it means). Both output bounds carry the reserved
  // one: some upstreams read only max_tokens, others only max_completion_tokens.
  const bounds =
    body.max_completion_tokens != null
      ? { max_tokens: maxOut, max_completion_tokens: maxOut }
      : { max_tokens: maxOut }
  return runModelCall(
    deps,
    payer,
    {
      model,
      path: '/chat/completions',
      startedAtMs,
      promptTokens,
      worstOutputTokens: maxOut * (body.n ?? 1),
      stream,
      includeUsage: body.stream_options?.include_usage === true,
      // What routing needs: the prompt's prefix blocks (where there is a choice of nodes).
      prefix: () =>
        model.routes.length > 1 ? chatPrefix(model.id, body.messages, body.tools, promptTokens) : NO_PREFIX,
      session: sessionHint ?? body.user,
      completionId: `chatcmpl-${requestId}`,
      body: (upstreamModel) =>
        JSON.stringify(
          stream
            ? { ...body, model: upstreamModel, ...bounds, stream_options: { include_usage: true } }
            : { ...body, model: upstreamModel, ...bounds },
        ),
      textOf: completionTextOf,
      shape: CHAT_STREAM,
      trace,
    },
    signal,
    requestId,
    cut,
  )
}

/** What a front end decided for one upstream request; the lifecycle (runModelCall) does the rest. */
export interface ModelCall {
  readonly model: ModelConfig
  /** The upstream endpoint; its replies (JSON, SSE chunks) carry OpenAI's id, model and usage. */
  readonly path: '/chat/completions' | '/completions'
  readonly startedAtMs: number
  /** Tropa's count of the prompt (all of its prompts). */
  readonly promptTokens: number
  /** The most output tokens the answer may bill (the bound sent times the choices asked for). */
  readonly worstOutputTokens: number
  readonly stream: boolean
  /** The client asked for the usage chunk (stream_options.include_usage). */
  readonly includeUsage: boolean
  /** The prompt's prefix blocks for routing, worked out once the request is admitted. */
  readonly prefix: () => PromptPrefix
  readonly session: string | undefined
  /** The id the client is shown (`chatcmpl-…`, `cmpl-…`). */
  readonly completionId: string
  /** The upstream body, carrying a route's model name. */
  readonly body: (upstreamModel: string) => string
  /** A JSON answer's generated text, counted when the upstream's usage is missing or not sane. */
  readonly textOf: (value: ChatCompletion) => string
  readonly shape: StreamShape
  /** The request's trace (tracing on): reserve, attempts, first token and settle become spans. */
  readonly trace?: RequestTrace | undefined
}

/**
 * The request lifecycle, once for every endpoint that calls a chat model: reserve -> rate-limit
 * -> route (with failover) -> relay -> settle. The reservation is taken before choosing a node,
 * so a failover never bills twice and a refused request never reaches an upstream.
 */
export function runModelCall(
  deps: ChatDeps,
  payer: Payer,
  call: ModelCall,
  signal: AbortSignal,
  requestId: string,
  cut?: () => void,
): Promise<Response> {
  // (Not async: no promise of its own on the pass-through path. Its callers are async functions,
  // so a refusal thrown here reaches the client as their rejection.)
  // Undefined for what the HTTP layer does not measure; set before the reservation, so a 402 has its model.
  const rec = deps.telemetry.of(requestId)
  rec?.call(call.model.id, payer.org.id, payer.key.id)
  if (!payer.key.allows(call.model.id)) throw modelNotAllowed(call.model.id)
  const worst = costNano(reservedPromptTokens(call.promptTokens), call.worstOutputTokens, call.model.price)
  if (payer.quoteOnly) return quoteCall(deps, payer, call, worst, requestId)
  // A closure made in an async function keeps every variable of that function alive (JSC), and
  // the lifecycle's closures (the relay's settle) live as long as a stream. So the lifecycle is
  // not given `call`, whose body and prefix closures hold the parsed request, the whole prompt:
  // they go in `source`, emptied once they cannot be needed (no closure is made here).
  // Named one by one (a rest pattern copies property by property, 1 us a request); the Record
  // makes a field added to ModelCall, optional or not, a type error until it is named here.
  const lean: Omit<ModelCall, 'body' | 'prefix'> = {
    model: call.model,
    path: call.path,
    startedAtMs: call.startedAtMs,
    promptTokens: call.promptTokens,
    worstOutputTokens: call.worstOutputTokens,
    stream: call.stream,
    includeUsage: call.includeUsage,
    session: call.session,
    completionId: call.completionId,
    textOf: call.textOf,
    shape: call.shape,
    trace: call.trace,
  } satisfies Record<Exclude<keyof ModelCall, 'body' | 'prefix'>, unknown>
  return lifecycle(
    deps,
    payer,
    lean,
    { body: call.body, prefix: call.prefix },
    worst,
    rec,
    signal,
    requestId,
    cut,
  )
}

/** A call's closures over the parsed request: the upstream body and the prompt's prefix blocks. */
interface CallSource {
  body: ModelCall['body'] | undefined
  prefix: ModelCall['prefix'] | undefined
}

async function lifecycle(
  deps: ChatDeps,
  payer: Payer,
  call: Omit<ModelCall, 'body' | 'prefix'>,
  source: CallSource,
  worst: bigint,
  rec: RequestRecord | undefined,
  signal: AbortSignal,
  requestId: string,
  cut?: () => void,
): Promise<Response> {
  const { model, promptTokens, stream, startedAtMs, textOf } = call
  // The upstream body for a route, while a node may still be tried (emptied once one answers).
  const upstreamBody = (r: RouteConfig): string => {
    if (!source.body) throw new Error('the upstream body was asked for after a node answered')
    return source.body(r.upstreamModel)
  }
  // The local meter answers at once (no promise to wait on); the shared one (Redis) does not.
  const trace = call.trace
  const reserved = reserve(deps, payer, worst, trace)
  const reservation = reserved instanceof Promise ? await reserved : reserved
  // Counted only once the money is reserved, so a 402 does not eat into the limits below. The
  // slot, when the key has max_concurrency, is held until the reservation is settled or released.
  let slot: Slot | undefined
  if (payer.key.maxConcurrency !== null || hasRateLimits(payer.key, payer.org)) {
    try {
      slot = await admit(deps, payer, model.id, promptTokens)
    } catch (err) {
      deps.meter.release(reservation)
      throw err
    }
  }

  const prefix = source.prefix?.() ?? NO_PREFIX
  source.prefix = undefined
  const route = {
    promptTokens,
    prefix: prefix.blocks,
    blockTokens: prefix.blockTokens,
    session: call.session,
    ttftBudgetMs: payer.ttftBudgetMs,
  }
  const completionId = call.completionId
  const headers = (c: Candidate): Record<string, string> => {
    const h: Record<string, string> = { 'x-request-id': requestId, 'x-tropa-node': c.node.name }
    if (rec) deps.telemetry.stamp(rec, h)
    return h
  }
  const charge = new CallCharge(
    deps,
    payer,
    model,
    requestId,
    startedAtMs,
    promptTokens,
    reservation,
    slot,
    rec,
    trace,
  )

  try {
    if (!stream) {
      const answer = await dispatch(
        deps,
        {
          model,
          path: call.path,
          stream,
          ...route,
          body: upstreamBody,
          accept: async (reply, c) => parseCompletion(await readBody(reply, deps, c.node.name), c.node.name),
          trace,
        },
        signal,
      )
      source.body = undefined
      const { value, candidate, attempt } = answer
      rec?.answered(answer, candidate.node.name, false, performance.now())
      charge.ttftMs = Date.now() - startedAtMs
      trace?.child('first token', undefined, startedAtMs).end()
      value.id = completionId
      value.model = model.id
      const usage = charge.billed(sanitizeUsage(value.usage), () => countTokens(textOf(value)))
      finishAttempt(deps, attempt, 'ok', cachedOf(usage), usage.completion_tokens)
      const charged = charge.settle(candidate, usage, () => 0, 'ok')
      const costText = formatRub(charged)
      usage.cost_rub = Number(costText)
      value.usage = usage
      const h: Record<string, string> = { ...headers(candidate), 'x-tropa-cost-rub': costText }
      const receipt = charge.receiptOf(charged)
      if (receipt) {
        const signed = await receipt
        if (signed) {
          usage.receipt = signed
          h[RECEIPT_HEADER] = signed
        }
      }
      return Response.json(value, { headers: h })
    }

    const dispatched = dispatch(
      deps,
      {
        model,
        path: call.path,
        stream,
        ...route,
        body: upstreamBody,
        accept: (reply, c) => firstChunk(reply, deps, c),
        discard: (lost) => {
          lost.reply.abort(new Error('another node answered first'))
          lost.reader.cancel().catch(() => {})
        },
        trace,
      },
      signal,
    )
    /** The client's SSE body from the winning node's first chunk on. */
    const relayFrom = (won: Dispatched<FirstChunk>) => openRelay(charge, won, source, call, cut)
    // No first token by server.sse_keep_alive_ms: the headers go out now, with SSE comments
    // until it comes, so a proxy's idle timeout does not cut the wait (dispatch goes on below,
    // failing over and hedging as before; a failure now reaches the client as an error event).
    const won =
      deps.sseKeepAliveMs > 0
        ? await beforeKeepAlive(deps, dispatched, startedAtMs + deps.sseKeepAliveMs)
        : await dispatched
    if (won === KEEP_ALIVE)
      return new Response(
        keptAlive(deps, dispatched, relayFrom, requestId, (err) => {
          slot?.release()
          deps.meter.release(reservation)
          trace?.end(undefined, err)
        }),
        { headers: { 'x-request-id': requestId, ...SSE_HEADERS } },
      )
    // (Not relayFrom: a closure made in this async function would keep its whole frame for the
    // stream's life.)
    return new Response(directStream(openRelay(charge, won, source, call, cut)), {
      headers: { ...headers(won.candidate), ...SSE_HEADERS },
    })
  } catch (err) {
    slot?.release()
    deps.meter.release(reservation)
    throw err
  }
}

/**
 * A call's charge: settled once, from the upstream's usage when it is sane (sanitizeUsage), else
 * Tropa's own counts marked estimated (billed), and its receipt. A class, not the lifecycle's
 * closures: a stream's relay keeps this for its life, where a closure made in the (async)
 * lifecycle kept every variable of the lifecycle (the prompt's prefix blocks among them).
 */
class CallCharge {
  /** Set when the chosen node's first byte (stream) or whole body (JSON) arrived. */
  ttftMs: number | null = null
  /** The settlement (receipts on: its receipt is signed from it). */
  private settled: Settlement | undefined

  constructor(
    readonly deps: ChatDeps,
    private readonly payer: Payer,
    readonly model: ModelConfig,
    readonly requestId: string,
    readonly startedAtMs: number,
    private readonly promptTokens: number,
    readonly reservation: Reservation,
    readonly slot: Slot | undefined,
    readonly rec: RequestRecord | undefined,
    readonly trace: RequestTrace | undefined,
  ) {}

  /** What is billed, and shown to the client. */
  billed(usage: Usage | undefined, completionTokens: () => number): Usage {
    return usage ?? estimatedUsage(this.promptTokens, completionTokens())
  }

  settle(c: Candidate, usage: Usage | undefined, completionTokens: () => number, outcome: string): bigint {
    const { deps, payer, model } = this
    const u = this.billed(usage, completionTokens)
    const p = u.prompt_tokens
    const cTokens = u.completion_tokens
    const cached = cachedOf(u)
    this.slot?.release()
    deps.limiter.used(payer.key, payer.org, model.id, cTokens)
    const s: Settlement = {
      requestId: this.requestId,
      model: model.id,
      node: c.node.name,
      promptTokens: p,
      completionTokens: cTokens,
      // Cached prompt tokens at the model's cached price (the reservation took the full one).
      costNano: costNano(p, cTokens, model.price, cached),
      batchId: null,
      startedAtMs: this.startedAtMs,
      endedAtMs: Date.now(),
      outcome,
      estimated: u.estimated === true,
      cachedTokens: cached ?? null,
      ttftMs: this.ttftMs,
      endUser: payer.endUser ?? null,
      // The key the receipt is signed with: an export signs the row again with it.
      receiptKid: deps.receipts?.kid ?? null,
    }
    const charged = deps.meter.settle(this.reservation, s)
    this.settled = s
    this.rec?.settled(p, cTokens, cached ?? 0, charged)
    if (this.trace) traceSettled(this.trace, c, model.id, u, charged)
    return charged
  }

  /** The receipt of the charge just settled; undefined when receipts are off (or nothing was settled). */
  receiptOf(charged: bigint): Promise<string | undefined> | undefined {
    const s = this.settled
    const receipts = this.deps.receipts
    if (!receipts?.responses || !s?.receiptKid) return undefined
    return receipts.sign(s.receiptKid, {
      requestId: this.requestId,
      orgId: this.payer.org.id,
      keyId: this.payer.key.id,
      model: this.model.id,
      promptTokens: s.promptTokens,
      cachedTokens: receiptCount(s.cachedTokens),
      completionTokens: s.completionTokens,
      costNano: charged,
      endedAtMs: s.endedAtMs,
    })
  }
}

/**
 * The relay of a stream whose node answered: its events rewritten (ids, model, usage with its
 * cost and receipt) and settled once. Not async, so its two callbacks keep only what they name.
 */
function openRelay(
  charge: CallCharge,
  won: Dispatched<FirstChunk>,
  source: CallSource,
  call: Pick<ModelCall, 'completionId' | 'includeUsage' | 'shape'>,
  cut: (() => void) | undefined,
): RelaySource {
  // A node answered: no other will be tried, and the parsed request can go.
  source.body = undefined
  const { value: first, candidate, attempt } = won
  const { deps, rec, trace, startedAtMs } = charge
  const includeUsage = call.includeUsage
  // The attempt lives as long as the stream: not the prompt's prefix blocks with it.
  attempt.shed()
  rec?.answered(won, candidate.node.name, true, performance.now())
  charge.ttftMs = Date.now() - startedAtMs
  trace?.child('first token', undefined, startedAtMs).end()
  // Settles when the usage event arrives (or at [DONE] without one) so its cost can ride in it.
  const relay: ChatStreamRelay = new ChatStreamRelay(
    call.completionId,
    charge.model.id,
    includeUsage,
    (usage) => {
      const u = charge.billed(usage, () => countTokens(relay.generated))
      const charged = charge.settle(candidate, u, () => 0, 'ok')
      u.cost_rub = nanoToRubNumber(charged)
      // The receipt rides in the usage chunk, so only a client that asked for it is signed one.
      const receipt = includeUsage ? charge.receiptOf(charged) : undefined
      if (!receipt) return u
      return receipt.then((signed) => {
        if (signed) u.receipt = signed
        return u
      })
    },
    call.shape,
  )
  const reservation = charge.reservation
  return new RelaySource(
    deps,
    first,
    relay,
    attempt,
    reservation,
    (usage, outcome) => {
      charge.slot?.release()
      // The generated text is read (out of the relayed events) only when there is no usage.
      if (usage) return void charge.settle(candidate, usage, () => countTokens(relay.generated), outcome)
      const text = relay.generated
      if (text.length <= COUNT_SLICE_CHARS)
        return void charge.settle(candidate, usage, () => countTokens(text), outcome)
      // A long answer cut short (say many streams cut at once) is counted a slice at a time.
      return countTokensYielding(text).then(
        (n) => void (reservation.done || charge.settle(candidate, usage, () => n, outcome)),
        (err) =>
          deps.log('error', 'counting a cut stream failed', {
            error: String(err),
            requestId: charge.requestId,
          }),
      )
    },
    cut,
    rec,
  )
}

/**
 * Admission past the money, in this order: the key's max_concurrency (a slot, returned), then the
 * rate limits (the key's, the organization's, the organization's for the model); a refusal gives
 * the slot back. A key and organization with none of them cost two field checks.
 */
export async function admit(
  deps: Pick<ChatDeps, 'limiter' | 'concurrency'>,
  payer: Payer,
  modelId: string,
  promptTokens: number,
): Promise<Slot | undefined> {
  let slot: Slot | undefined
  if (payer.key.maxConcurrency !== null) {
    const s = deps.concurrency.acquire(payer.key)
    slot = s instanceof Promise ? await s : s
  }
  try {
    const limited = deps.limiter.admit(payer.key, payer.org, modelId, promptTokens)
    if (limited) await limited
  } catch (err) {
    slot?.release()
    throw err
  }
  return slot
}

/**
 * The worst case reserved (402 when a limit refuses it), as the trace's `reserve` span when there
 * is a trace. Answers at once where the meter does (one node), so the pass-through path awaits
 * nothing here.
 */
export function reserve(
  deps: Pick<ChatDeps, 'meter'>,
  payer: Payer,
  amountNano: NanoRub,
  trace: RequestTrace | undefined,
): Reservation | Promise<Reservation> {
  if (!trace) return deps.meter.reserve(payer.key, payer.org, amountNano, payer.endUser)
  const span = trace.child('reserve')
  const failed = (err: unknown): never => {
    fail(span, err)
    span.end()
    throw err
  }
  let reserved: Reservation | Promise<Reservation>
  try {
    reserved = deps.meter.reserve(payer.key, payer.org, amountNano, payer.endUser)
  } catch (err) {
    return failed(err)
  }
  if (reserved instanceof Promise)
    return reserved.then((r) => {
      span.end()
      return r
    }, failed)
  span.end()
  return reserved
}

/** The settle span, and the root's GenAI attributes (OpenTelemetry's semantic conventions). */
function traceSettled(
  trace: RequestTrace,
  c: Candidate,
  modelId: string,
  u: Usage,
  costNanoRub: bigint,
): void {
  trace.child('settle').end()
  trace.end({
    'gen_ai.response.model': modelId,
    'gen_ai.provider.name': c.route.provider,
    'gen_ai.usage.input_tokens': u.prompt_tokens,
    'gen_ai.usage.output_tokens': u.completion_tokens,
    'tropa.node': c.node.name,
    'tropa.cost_rub': formatRub(costNanoRub),
    'tropa.estimated_usage': u.estimated === true,
  })
}

/** The output bound a request asks for: the smaller of max_tokens and max_completion_tokens. */
export function askedOutput(
  body: Pick<ChatRequest, 'max_tokens' | 'max_completion_tokens'>,
): number | undefined {
  const a = body.max_completion_tokens ?? undefined
  const b = body.max_tokens ?? undefined
  return a === undefined ? b : b === undefined ? a : Math.min(a, b)
}

/**
 * Tokens the answer may use: asked for, or what the context leaves (at most the model's output
 * cap); 400 when it cannot fit.
 */
export function outputBudget(
  model: ModelConfig,
  promptTokens: number,
  asked: number | null | undefined,
): number {
  const left = model.contextLength - promptTokens
  const cap = model.maxOutputTokens
  if (asked !== undefined && asked !== null) {
    if (cap !== undefined && asked > cap)
      throw new InvalidValue(
        `max_tokens ${asked} is over ${model.id}'s output limit of ${cap} tokens`,
        'max_tokens',
      )
    if (promptTokens + asked > model.contextLength)
      throw new ContextLengthExceeded(
        `the prompt (${promptTokens} tokens) plus max_tokens (${asked}) exceeds ${model.id}'s context of ${model.contextLength} tokens`,
      )
    return asked
  }
  if (left < 1)
    throw new ContextLengthExceeded(
      `the prompt (${promptTokens} tokens) leaves no room in ${model.id}'s context of ${model.contextLength} tokens`,
    )
  return cap !== undefined && cap < left ? cap : left
}

/** The rules TypeBox cannot say: which roles need content, and tool linkage. */
export function checkMessages(messages: readonly ChatMessage[]): void {
  messages.forEach((m, i) => {
    const at = `messages[${i}]`
    if (m.role === 'assistant') {
      if ((m.content === undefined || m.content === null) && !(m.tool_calls && m.tool_calls.length > 0))
        throw new InvalidValue(`${at}: an assistant message needs content or tool_calls`, `${at}.content`)
      return
    }
    if (m.content === undefined || m.content === null)
      throw new InvalidValue(`${at}: a ${m.role} message needs content`, `${at}.content`)
    if (m.role === 'tool' && !m.tool_call_id)
      throw new InvalidValue(`${at}: a tool message needs tool_call_id`, `${at}.tool_call_id`)
    if (
      m.role !== 'user' &&
      Array.isArray(m.content) &&
      m.content.some((p) => p.type !== 'text' && p.type !== 'refusal')
    )
      throw new InvalidValue(
        `${at}: only user messages may carry image, audio or file parts`,
        `${at}.content`,
      )
  })
}

function cachedOf(usage: Usage | undefined): number | undefined {
  const n = usage?.prompt_tokens_details?.cached_tokens
  return typeof n === 'number' ? n : undefined
}

function parseCompletion(text: string, node: string): ChatCompletion {
  try {
    const v = JSON.parse(text) as ChatCompletion
    if (v && typeof v === 'object' && Array.isArray(v.choices)) return v
  } catch {
    // fall through
  }
  throw new UpstreamFailed(`${node} sent a malformed completion`)
}

function completionTextOf(c: ChatCompletion): string {
  let text = ''
  for (const ch of (c.choices as { message?: { content?: unknown; tool_calls?: unknown } }[]) ?? []) {
    if (typeof ch.message?.content === 'string') text += ch.message.content
    if (ch.message?.tool_calls) text += JSON.stringify(ch.message.tool_calls)
  }
  return text
}

interface FirstChunk {
  reply: UpstreamReply
  reader: BodyReader
  chunk: Uint8Array
}

/** Waits for the stream's first bytes: until then a silent or broken node can be failed over. */
async function firstChunk(reply: UpstreamReply, deps: UpstreamDeps, c: Candidate): Promise<FirstChunk> {
  const reader = replyReader(reply)
  if (!reader) throw new UpstreamFailed(`${c.node.name} sent an empty stream`)
  const deadline = deps.watchdog.watch(Date.now() + deps.timeouts.firstByteTimeoutMs, () =>
    reply.abort(new UpstreamTimeout(`${c.node.name} sent no first token in time`)),
  )
  try {
    const { done, value } = await reader.read()
    if (done || !value) throw new UpstreamFailed(`${c.node.name} closed the stream before its first token`)
    const head = new TextDecoder().decode(value.subarray(0, 64))
    // An error as the very first event is a failure before the first byte: fail over.
    if (ERROR_EVENT.test(head)) {
      reply.abort(new UpstreamFailed('upstream error event'))
      throw new UpstreamFailed(`${c.node.name} answered its stream with an error`)
    }
    // Azure opens a stream with an event of empty choices (its prompt filter results), before any
    // token: read on to the event after it, so that a resource failing or stalling in between is
    // still failed over under the first-token deadline.
    if (OPENING_EVENT.test(head)) return { reply, reader, chunk: await pastOpening(reader, value, reply, c) }
    return { reply, reader, chunk: value }
  } catch (err) {
    if (err instanceof UpstreamFailed) throw err
    throw new UpstreamFailed(
      `${c.node.name} broke the stream before its first token`,
      'upstream_error',
      null,
      (err as Error).message,
    )
  } finally {
    deps.watchdog.clear(deadline)
  }
}

/** Azure's opening event, in both key orders it has used: `{"choices":[],...` or `{"id":"",...`. */
const OPENING_EVENT = /^data:\s*\{\s*(?:"choices"\s*:\s*\[\s*\]|"id"\s*:\s*"")/
/** How much of a stream's opening Tropa reads before it commits to the node regardless. */
const MAX_OPENING_BYTES = 64 * 1024

/** The stream's first bytes up to and including the start of the event after its opening one. */
async function pastOpening(
  reader: BodyReader,
  first: Uint8Array,
  reply: UpstreamReply,
  c: Candidate,
): Promise<Uint8Array> {
  let chunk = first
  for (;;) {
    const text = new TextDecoder().decode(chunk)
    const end = /\r?\n\r?\n/.exec(text)
    if (end && text.length > end.index + end[0].length) {
      if (ERROR_EVENT.test(text.slice(end.index + end[0].length))) {
        reply.abort(new UpstreamFailed('upstream error event'))
        throw new UpstreamFailed(`${c.node.name} answered its stream with an error`)
      }
      return chunk
    }
    if (chunk.byteLength > MAX_OPENING_BYTES) return chunk
    const { done, value } = await reader.read()
    if (done || !value) throw new UpstreamFailed(`${c.node.name} closed the stream before its first token`)
    chunk = Buffer.concat([chunk, value])
  }
}

/**
 * The client's SSE body: upstream events relayed as they arrive; settles exactly once, when the
 * upstream ends, breaks, or the client goes away or stops reading (then it pays for what it was
 * sent).
 *
 * Backpressure: Bun's direct-stream write returns the byte count when the socket took the bytes,
 * and a Promise when it kept them because the socket is full. Only then does the relay wait (for
 * the drain, or the client's stall deadline) before reading the upstream again, so a client that
 * does not read stops the upstream too (Bun's fetch stops reading a body nobody reads): at most
 * one relayed chunk is held per stream, whatever the client does. The fast path costs a type check.
 *
 * A class, not closures: an open stream holds this one object (its methods on the prototype) and
 * two small callbacks, where a closure per step and its scope were about a kilobyte a stream.
 */
class RelaySource implements Bun.DirectUnderlyingSource<Uint8Array> {
  readonly type = 'direct' as const
  private readonly reader: BodyReader
  private readonly reply: UpstreamReply
  private readonly c: Candidate
  /** The opening bytes, relayed once (not kept for the stream's life). */
  private opening: Uint8Array | undefined
  private readonly firstChunkAtMs = Date.now()
  private lastChunkAtMs = this.firstChunkAtMs
  private finished = false
  /** The client went away (cancel). */
  private gone = false
  /** The client's stream is closed (by this side). */
  private closed = false
  /** The write the socket kept (the client is behind), while it is pending. */
  private pending: Promise<unknown> | undefined
  private controller: ReadableStreamDirectController | undefined
  private readonly deadline: Deadline
  /** A graceful stop's deadline ends the stream through its upstream (the pull loop sees the reason). */
  private readonly end: () => void
  private readonly endSlot: number

  constructor(
    private readonly deps: ChatDeps,
    first: FirstChunk,
    private readonly relay: ChatStreamRelay,
    private readonly attempt: Attempt,
    private readonly reservation: Reservation,
    /** Returns a promise when the charge is settled later (a long answer counted a slice at a time). */
    private readonly settle: (usage: Usage | undefined, outcome: string) => Promise<void> | undefined,
    private readonly cut: (() => void) | undefined,
    private readonly rec: RequestRecord | undefined,
  ) {
    this.reader = first.reader
    const reply = first.reply
    this.reply = reply
    this.opening = first.chunk
    const c = attempt.candidate
    this.c = c
    this.deadline = deps.watchdog.watch(Date.now() + deps.timeouts.idleTimeoutMs, () =>
      reply.abort(new UpstreamTimeout(`${c.node.name} stalled mid-stream`)),
    )
    this.end = () => reply.abort(new ServerShuttingDown())
    this.endSlot = deps.streams.add(this.end)
  }

  private finish(outcome: string, nodeOk: boolean): void {
    if (this.finished) return
    this.finished = true
    const deps = this.deps
    deps.watchdog.clear(this.deadline)
    deps.streams.delete(this.endSlot, this.end)
    const usage = this.relay.usage
    finishAttempt(deps, this.attempt, nodeOk ? 'ok' : 'failed', cachedOf(usage), usage?.completion_tokens)
    const later = this.reservation.done ? undefined : this.settle(usage, outcome)
    // The record ends with what was billed, so after a charge counted later.
    const rec = this.rec
    if (rec) {
      const first = this.firstChunkAtMs
      const last = this.lastChunkAtMs
      if (later) void later.then(() => rec.ended(outcome, first, last))
      else rec.ended(outcome, first, last)
    }
  }

  /**
   * Waits until the socket has taken the bytes it kept; true when the client took nothing for
   * streamWriteTimeoutMs. The upstream's idle deadline stands still meanwhile (the upstream is not
   * read, through no fault of its own).
   */
  private async drained(pending: Promise<unknown>): Promise<boolean> {
    const deps = this.deps
    this.deadline.atMs = Number.POSITIVE_INFINITY
    let stall!: Deadline
    const stalled = new Promise<boolean>((resolve) => {
      stall = deps.watchdog.watch(Date.now() + deps.streamWriteTimeoutMs, () => resolve(true))
    })
    const late = await Promise.race([pending.then(noStall, noStall), stalled])
    deps.watchdog.clear(stall)
    this.deadline.atMs = Date.now() + deps.timeouts.idleTimeoutMs
    return late && !this.gone
  }

  /** Writes; returns a promise only when the socket kept the bytes (the client is behind). */
  private send(bytes: Uint8Array | string | undefined): Promise<boolean> | undefined {
    const controller = this.controller
    if (!bytes || this.closed || this.gone || !controller) return
    const written: number | Promise<unknown> = controller.write(bytes)
    controller.flush()
    if (!(written instanceof Promise)) return
    this.pending = written
    return this.drained(written)
  }

  private close(): void {
    if (this.closed) return
    this.closed = true
    this.controller?.close()
  }

  /** The client took nothing for too long: stop the upstream, bill what was sent, drop it. */
  private async cutStalled(): Promise<void> {
    this.finish('client_stalled', true)
    this.reply.abort(new Error('client stopped reading'))
    this.reader.cancel().catch(() => {})
    this.closed = true
    if (this.cut) {
      // Closes the socket within a few seconds (Bun's timer), quietly; the one kept chunk
      // is freed with it.
      this.cut()
      await this.pending
    } else this.controller?.close(new Error('client stopped reading'))
  }

  /** The usage event waited for its receipt: send it (and what followed); true if the client stalled. */
  private async resumed(): Promise<boolean> {
    await this.relay.held
    const wait = this.send(this.relay.resume())
    return wait ? await wait : false
  }

  // A direct stream (Bun): one pull() for the whole body writes each relayed chunk straight to
  // the socket, with no queue and no promise round per chunk as a pull-per-chunk stream has.
  async pull(controller: ReadableStreamDirectController): Promise<void> {
    this.controller = controller
    const relay = this.relay
    const reader = this.reader
    const c = this.c
    const idle = this.deps.timeouts.idleTimeoutMs
    try {
      const head = this.opening!
      this.opening = undefined
      let wait = this.send(relay.push(head))
      if (wait && (await wait)) return this.cutStalled()
      if (relay.held && (await this.resumed())) return this.cutStalled()
      for (;;) {
        const { done, value } = await reader.read()
        if (done) {
          wait = this.send(relay.end())
          if (wait && (await wait)) return this.cutStalled()
          if (relay.held && (await this.resumed())) return this.cutStalled()
          if (!relay.sawDone && !relay.usage) {
            this.finish('upstream_broken', false)
            this.send(errorEvent(`${c.node.name} ended the stream early`, 'upstream_error'))
          } else this.finish('ok', true)
          return this.close()
        }
        this.lastChunkAtMs = Date.now()
        this.deadline.atMs = this.lastChunkAtMs + idle
        if (relayedThisTurn(value.length) > TURN_BUDGET_BYTES) await nextTurn()
        wait = this.send(relay.push(value))
        if (wait && (await wait)) return this.cutStalled()
        if (relay.held && (await this.resumed())) return this.cutStalled()
        if (relay.upstreamError !== undefined) {
          this.finish('upstream_error', false)
          this.reply.abort(new UpstreamFailed('upstream sent an error event'))
          this.send(errorEvent(`${c.node.name} failed mid-stream`, 'upstream_error'))
          return this.close()
        }
      }
    } catch (err) {
      if (this.finished) return this.close()
      const timeout = err instanceof UpstreamTimeout
      const shutdown = err instanceof ServerShuttingDown
      this.finish(timeout ? 'upstream_timeout' : shutdown ? 'server_shutdown' : 'upstream_broken', shutdown)
      try {
        this.send(
          shutdown
            ? errorEvent(err.message, err.code, err.type)
            : errorEvent(
                timeout ? err.message : `upstream node ${c.node.name} broke the stream`,
                timeout ? 'upstream_timeout' : 'upstream_error',
              ),
        )
        this.close()
      } catch {
        // the client is gone too
      }
    }
  }

  cancel(): void {
    // The client went away: stop the upstream and bill what was sent.
    this.gone = true
    this.finish('client_disconnected', true)
    this.reply.abort(new Error('client disconnected'))
    this.reader.cancel().catch(() => {})
  }
}

/** An OpenAI error event for the client's stream. */
function errorEvent(message: string, code: string, type = 'upstream_error'): Uint8Array {
  return sseEvent({ error: { message, type, param: null, code } })
}

/** A direct stream (Bun) on `source`. */
function directStream(source: Bun.DirectUnderlyingSource<Uint8Array>): ReadableStream<Uint8Array> {
  // The web worker typings (batch worker) hide Bun's direct-stream overload of the constructor.
  return new ReadableStream<Uint8Array>(source as unknown as UnderlyingDefaultSource<Uint8Array>)
}

const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache',
  connection: 'keep-alive',
} as const

/** beforeKeepAlive's answer when the keep-alive time came first. */
const KEEP_ALIVE = Symbol('keep-alive')
const KEEP_ALIVE_COMMENT = new TextEncoder().encode(': keep-alive\n\n')

/** The dispatch's winner, or KEEP_ALIVE when none has come by `atMs` (the watchdog's tick late). */
function beforeKeepAlive<T>(
  deps: UpstreamDeps,
  dispatched: Promise<T>,
  atMs: number,
): Promise<T | typeof KEEP_ALIVE> {
  return new Promise((resolve, reject) => {
    const deadline = deps.watchdog.watch(atMs, () => resolve(KEEP_ALIVE))
    dispatched.then(
      (won) => {
        deps.watchdog.clear(deadline)
        resolve(won)
      },
      (err) => {
        deps.watchdog.clear(deadline)
        reject(err)
      },
    )
  })
}

/**
 * The body of a stream whose headers went out before its first token: a `: keep-alive` comment
 * now and every sse_keep_alive_ms while the dispatch goes on (failover and hedging unchanged),
 * then the winner's relay on the same socket. The status is 200 by now, so a dispatch that fails
 * ends the body with one error event (`release` gives the reservation back); a client that left
 * meanwhile aborted the dispatch through the request's signal. Comments are not written while the
 * socket holds earlier bytes: a client that reads nothing gets no more than one.
 */
function keptAlive(
  deps: ChatDeps,
  dispatched: Promise<Dispatched<FirstChunk>>,
  relayFrom: (won: Dispatched<FirstChunk>) => Bun.DirectUnderlyingSource<Uint8Array>,
  requestId: string,
  release: (err: unknown) => void,
): ReadableStream<Uint8Array> {
  // Both are closures of the (async) lifecycle, which keep its whole frame: let go once a node
  // has answered, so that a stream relayed after the keep-alive does not hold them for its life.
  let open: typeof relayFrom | undefined = relayFrom
  let unreserve: typeof release | undefined = release
  let gone = false
  let relay: Bun.DirectUnderlyingSource<Uint8Array> | undefined
  const source: Bun.DirectUnderlyingSource<Uint8Array> = {
    type: 'direct',
    async pull(controller) {
      let waiting = true
      let ended = false
      let held: unknown
      let beat: Deadline | undefined
      let endSlot = -1
      const comment = () => {
        if (!waiting || gone) return
        if (!(held instanceof Promise)) {
          held = controller.write(KEEP_ALIVE_COMMENT)
          controller.flush()
          if (held instanceof Promise) held.then(() => (held = undefined), noStall)
        }
        beat = deps.watchdog.watch(Date.now() + deps.sseKeepAliveMs, comment)
      }
      const stopWaiting = () => {
        waiting = false
        if (beat) deps.watchdog.clear(beat)
        deps.streams.delete(endSlot, end)
      }
      const fail = (e: TropaError) => {
        if (gone) return
        try {
          controller.write(
            sseEvent({ error: { message: e.message, type: e.type, param: e.param, code: e.code } }),
          )
          controller.close()
        } catch {
          // the client is gone too
        }
      }
      // A graceful stop's deadline while no node has answered yet: the client gets its error
      // event now; what the dispatch brings later is let go unbilled.
      const end = () => {
        ended = true
        stopWaiting()
        fail(new ServerShuttingDown())
      }
      endSlot = deps.streams.add(end)
      comment()
      let won: Dispatched<FirstChunk>
      try {
        won = await dispatched
      } catch (err) {
        stopWaiting()
        unreserve?.(err)
        // (the client's abort reason, when it left: nobody to tell)
        if (ended || (err as Error)?.name === 'AbortError') return
        if (err instanceof TropaError) return fail(err)
        deps.log('error', 'a kept-alive stream failed', {
          requestId,
          error: String((err as Error)?.stack ?? err),
        })
        return fail(new InternalError())
      }
      stopWaiting()
      if (ended) {
        won.value.reply.abort(new ServerShuttingDown())
        won.value.reader.cancel().catch(() => {})
        finishAttempt(deps, won.attempt, 'cancelled')
        return unreserve?.(new ServerShuttingDown())
      }
      relay = open!(won)
      open = undefined
      unreserve = undefined
      if (gone) return void relay.cancel?.(new Error('client disconnected'))
      return relay.pull(controller)
    },
    cancel(reason) {
      gone = true
      relay?.cancel?.(reason)
    },
  }
  return directStream(source)
}

const noStall = () => false

/**
 * Bytes all streams relayed since the event loop last turned. A read of data already buffered
 * resolves as a microtask, so after a burst (many fast upstreams, clients draining at once) the
 * relays would run back to back, holding the loop (1.3 s for 33 MB seen); past the budget a
 * stream waits for the next turn, so other requests are served in between. Costs an add and a
 * compare per chunk, and one setImmediate per turn that relays anything.
 */
let turnBytes = 0
let turnResetQueued = false
const TURN_BUDGET_BYTES = 64 * 1024
const resetTurn = () => {
  turnBytes = 0
  turnResetQueued = false
}
function relayedThisTurn(bytes: number): number {
  if (!turnResetQueued) {
    turnResetQueued = true
    setImmediate(resetTurn)
  }
  turnBytes += bytes
  return turnBytes
}
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve))
