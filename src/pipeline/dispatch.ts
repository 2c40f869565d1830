import type { Span } from '@opentelemetry/api'
import type { Config, ModelConfig, RouteConfig } from '../config/load.ts'
import {
  InvalidRequest,
  NoUpstreamAvailable,
  RateLimited,
  UpstreamFailed,
  UpstreamRejected,
  UpstreamTimeout,
  UpstreamUnreachable,
} from '../errors.ts'
import type { ShareBudget } from '../routing/budget.ts'
import type { Candidate, NodePool } from '../routing/nodes.ts'
import {
  Attempt,
  type Outcome,
  type RouteRequest,
  type RoutingPolicy,
  type Warmup,
  type WarmupReason,
} from '../routing/policy.ts'
import { fail, type RequestTrace } from '../tracing/span.ts'
import {
  replyReader,
  type UpstreamAdapter,
  type UpstreamPath,
  type UpstreamReply,
} from '../upstream/adapter.ts'
import { probeConnect } from '../upstream/connect-probe.ts'
import { ERROR_EVENT } from '../upstream/sse.ts'
import type { Watchdog } from '../upstream/watchdog.ts'

/** What the pipelines need to reach upstreams. */
export interface UpstreamDeps {
  readonly pool: NodePool
  readonly policy: RoutingPolicy
  readonly adapter: UpstreamAdapter
  readonly watchdog: Watchdog
  readonly timeouts: Config['upstream']
  /** Hedges of the first token allowed (a share of requests); undefined: hedging off. */
  readonly hedges: ShareBudget | undefined
  /** Failover attempts allowed after the first (a share of requests). */
  readonly retries: ShareBudget
  /** Counts session warm-ups (`warmUp`) for /metrics; undefined: not counted. */
  readonly warmups?: WarmupCounts | undefined
  readonly log: (
    level: 'debug' | 'info' | 'warn' | 'error',
    msg: string,
    fields?: Record<string, unknown>,
  ) => void
}

export interface Dispatch<T> {
  readonly model: ModelConfig
  readonly path: UpstreamPath
  readonly stream: boolean
  readonly promptTokens: number
  /** The prompt's prefix block hashes (routing/prefix.ts); empty when not indexed. */
  readonly prefix: readonly number[]
  readonly blockTokens: number
  readonly session: string | undefined
  /**
   * Deadline-aware admission: refuse the request (RateLimited, before any node sees it) when the
   * policy predicts no first token within this many ms on the node it would choose.
   */
  readonly ttftBudgetMs?: number | undefined
  readonly body: (route: RouteConfig) => string
  /**
   * Takes the upstream's 2xx reply up to the point where Tropa commits to it (the first chunk of
   * a stream, the whole body otherwise). Throwing UpstreamFailed there still fails over, since
   * the client has been sent nothing yet.
   */
  readonly accept: (reply: UpstreamReply, candidate: Candidate) => Promise<T>
  /** Frees a value accepted after another node already won (a lost hedge). */
  readonly discard?: (value: T) => void
  /** The request's trace: a span per attempt, continued upstream (tracing on). */
  readonly trace?: RequestTrace | undefined
}

export interface Dispatched<T> {
  readonly value: T
  readonly candidate: Candidate
  readonly attempt: Attempt
  /** performance.now() when the first attempt's request left (after its body was built). */
  readonly sentAt: number
  /** performance.now() of the answer's first byte: a stream's first chunk, a JSON reply's headers. */
  readonly firstByteAt: number
  /** Nodes tried, the winner included. */
  readonly tried: number
  /** A hedge was sent. */
  readonly hedged: boolean
}

type Settled<T> =
  | { ok: true; a: Attempt; value: T; headersAt: number }
  | { ok: false; a: Attempt; error: unknown }

interface Running<T> {
  readonly controller: AbortController
  readonly done: Promise<Settled<T>>
  readonly span?: Span | undefined
}

/** Ends an attempt on its node: the pool's health and in-flight count, and the policy's model. */
export function finishAttempt(
  deps: UpstreamDeps,
  a: Attempt,
  outcome: Outcome,
  cachedTokens?: number,
  completionTokens?: number,
): void {
  const nowMs = Date.now()
  if (outcome === 'cancelled') deps.pool.cancel(a.candidate.node)
  else deps.pool.end(a.candidate.node, outcome === 'ok', nowMs)
  deps.policy.ended(a, nowMs, outcome, cachedTokens, completionTokens)
}

/** What a node's failure tells the policy: a 429 or 503 is load, anything else a failure. */
function failedOutcome(err: UpstreamFailed): Outcome {
  return err.upstreamStatus === 429 || err.upstreamStatus === 503 ? 'overloaded' : 'failed'
}

/** A node that lost a hedge race is cancelled with this. */
class HedgeLost extends Error {
  constructor() {
    super('another node answered first')
  }
}

/**
 * Sends a request to the node the policy chooses and fails over to the next best on a node
 * failure, until one node's reply is accepted, `max_attempts` nodes were tried or the retry
 * budget is spent. A streamed request with no first chunk by the policy's hedge time is also
 * sent to the next best node (within the hedge budget); the first to answer wins and the other
 * is cancelled. The winner's attempt stays open: the caller finishes it when the response ends.
 */
export async function dispatch<T>(
  deps: UpstreamDeps,
  d: Dispatch<T>,
  signal: AbortSignal,
): Promise<Dispatched<T>> {
  const candidates = deps.pool.candidates(d.model.id)
  const exclude = new Set<Candidate>()
  const running = new Map<Attempt, Running<T>>()
  let tried = 0
  let hedged = false
  let sentAt = 0
  let lastError: Error | undefined
  deps.retries.earn()
  deps.hedges?.earn()

  const run = async (
    a: Attempt,
    controller: AbortController,
    traceparent: string | undefined,
  ): Promise<Settled<T>> => {
    const { route, node } = a.candidate
    try {
      const body = d.body(route)
      // Building the body is the router's own time; the wait on upstreams starts here.
      if (sentAt === 0) sentAt = performance.now()
      if (!node.answering) await probeConnect(route.baseUrl, node.name, deps.timeouts.connectTimeoutMs)
      const reply = await deps.adapter.send(
        { route, path: d.path, body, stream: d.stream, traceparent },
        controller,
        a.startedAtMs + (route.firstByteTimeoutMs ?? deps.timeouts.firstByteTimeoutMs),
      )
      const headersAt = performance.now()
      return { ok: true, a, value: await d.accept(reply, a.candidate), headersAt }
    } catch (error) {
      return { ok: false, a, error }
    }
  }

  const launch = (): boolean => {
    if (tried >= deps.timeouts.maxAttempts || signal.aborted) return false
    // A node that refused the connection never saw the request: moving on costs the fleet nothing.
    if (tried > 0 && !(lastError instanceof UpstreamUnreachable) && !deps.retries.take()) return false
    const nowMs = Date.now()
    const req: RouteRequest = {
      modelId: d.model.id,
      promptTokens: d.promptTokens,
      prefix: d.prefix,
      blockTokens: d.blockTokens,
      session: d.session,
      stream: d.stream,
      exclude,
      nowMs,
      batchQuietMs: deps.pool.batchQuietMs,
      canExplore: tried === 0 && d.path !== '/embeddings' && warming < MAX_WARMING,
      ttftBudgetMs: d.ttftBudgetMs,
    }
    const c = deps.policy.choose(candidates, req)
    if (!c) return false
    if (tried === 0 && d.ttftBudgetMs !== undefined) {
      const predicted = deps.policy.estimateTtftMs?.(c, req)
      if (predicted !== undefined && predicted > d.ttftBudgetMs) throw overBudget(d.ttftBudgetMs, predicted)
    }
    tried++
    exclude.add(c)
    deps.pool.begin(c.node, nowMs)
    const a = new Attempt(c, req, nowMs)
    deps.policy.started(a)
    const warm = deps.policy.takeWarmup?.()
    const controller = new AbortController()
    const onAbort = () => controller.abort(signal.reason)
    signal.addEventListener('abort', onAbort, { once: true })
    const traced = d.trace?.attempt({
      'tropa.node': c.node.name,
      'tropa.attempt': tried === 1 ? 'first' : running.size > 0 ? 'hedge' : 'failover',
      'gen_ai.provider.name': c.route.provider,
      'gen_ai.request.model': c.route.upstreamModel,
      'server.address': c.route.baseUrl,
    })
    // Until the node's reply is accepted the client leaving aborts the attempt; after that the
    // response body (the relay) watches the client.
    const done = run(a, controller, traced?.traceparent).finally(() =>
      signal.removeEventListener('abort', onAbort),
    )
    running.set(a, { controller, done, span: traced?.span })
    // After the request itself is on its way: the warm-up's body is built from it.
    if (warm !== undefined) warmUp(deps, d, warm, a)
    return true
  }

  /** Cancels every attempt still running (they lost, or the request is over). */
  const cancelRest = () => {
    for (const [a, r] of running) {
      r.span?.setAttribute('tropa.outcome', 'cancelled')
      r.span?.end()
      r.controller.abort(new HedgeLost())
      void r.done.then((s) => {
        if (s.ok) d.discard?.(s.value)
      })
      finishAttempt(deps, a, 'cancelled')
    }
    running.clear()
  }

  if (!launch()) throw new NoUpstreamAvailable(d.model.id)
  const first = running.keys().next().value!
  let hedgeAtMs =
    d.stream && deps.hedges && first.candidate.route.hedge ? deps.policy.hedgeAtMs?.(first) : undefined
  for (;;) {
    if (running.size === 0 && !launch()) throw lastError ?? new NoUpstreamAvailable(d.model.id)
    const settled = await next(running, hedgeAtMs)
    if (settled === 'hedge') {
      hedgeAtMs = undefined
      if (deps.hedges?.take() && launch()) {
        hedged = true
        deps.log('debug', 'hedged the first token', { model: d.model.id, node: first.candidate.node.name })
      }
      continue
    }
    const { a } = settled
    const span = running.get(a)?.span
    running.delete(a)
    if (span) {
      if (!settled.ok) fail(span, settled.error)
      span.end()
    }
    if (settled.ok) {
      hedgeAtMs = undefined
      if (d.stream) deps.policy.firstChunk(a, Date.now())
      cancelRest()
      return {
        value: settled.value,
        candidate: a.candidate,
        attempt: a,
        sentAt,
        firstByteAt: d.stream ? performance.now() : settled.headersAt,
        tried,
        hedged,
      }
    }
    const err = settled.error
    if (signal.aborted) {
      finishAttempt(deps, a, 'cancelled')
      cancelRest()
      throw signal.reason ?? err
    }
    if (err instanceof UpstreamRejected) {
      // The node answered; it refused this request, as any node would. The client gets its
      // message cleaned; the operator, the original.
      deps.log('warn', 'upstream rejected the request', {
        node: a.candidate.node.name,
        model: d.model.id,
        status: err.upstreamStatus,
        upstreamMessage: err.detail,
      })
      finishAttempt(deps, a, 'ok')
      cancelRest()
      throw err
    }
    if (err instanceof InvalidRequest) {
      // A translating adapter found the request has no meaning for its provider (n > 1 on
      // Anthropic, say): the node never saw it, and must not be judged by it.
      finishAttempt(deps, a, 'cancelled')
      cancelRest()
      throw err
    }
    if (!(err instanceof UpstreamFailed)) {
      finishAttempt(deps, a, 'failed')
      cancelRest()
      throw err
    }
    finishAttempt(deps, a, failedOutcome(err))
    deps.log('warn', 'upstream attempt failed', {
      node: a.candidate.node.name,
      model: d.model.id,
      error: err.message,
      detail: err.detail,
    })
    lastError = err
    // A failure ends hedging: the failover below is the second copy.
    hedgeAtMs = undefined
  }
}

/** Warm-ups sent and failed, by reason (`tropa_warmups_total`, `tropa_warmups_failed_total`). */
export class WarmupCounts {
  readonly sentCount: Record<WarmupReason, number> = { session: 0, explore: 0 }
  readonly failedCount: Record<WarmupReason, number> = { session: 0, explore: 0 }
  sent(reason: WarmupReason): void {
    this.sentCount[reason]++
  }
  ended(reason: WarmupReason, ok: boolean): void {
    if (!ok) this.failedCount[reason]++
  }
}

/** Warm-ups in flight in this process, all models: past this many, a new one is not sent. */
const MAX_WARMING = 32
let warming = 0

/** Request fields that would make a one-token warm-up produce more, or be refused. */
const NOT_IN_WARMUPS = [
  'min_tokens',
  'echo',
  'logprobs',
  'top_logprobs',
  'prompt_logprobs',
  'use_beam_search',
] as const

/**
 * The body of a warm-up: the request's own, for one token out, streamed with its usage (its first
 * chunk times the node's prefill of the prompt; undefined: not warmable, as a legacy completion of
 * several prompts).
 */
export function warmupBody(body: string): string | undefined {
  let json: Record<string, unknown>
  try {
    json = JSON.parse(body) as Record<string, unknown>
  } catch {
    return undefined
  }
  if (Array.isArray(json.prompt) && json.prompt.length !== 1) return undefined
  json.stream = true
  json.stream_options = { include_usage: true }
  for (const k of NOT_IN_WARMUPS) delete json[k]
  json.n = 1
  if ('best_of' in json) json.best_of = 1
  // One token out, whichever bound the body carries (both, when it carries both).
  if ('max_completion_tokens' in json) json.max_completion_tokens = 1
  if ('max_tokens' in json || !('max_completion_tokens' in json)) json.max_tokens = 1
  return JSON.stringify(json)
}

/**
 * Warms a node with the request's prompt: the same body, one token out, streamed, its answer read
 * and dropped (answered to no one, billed to no one: the node's own compute, as a hedge's lost
 * copy is). The policy asked for it (`takeWarmup`): a new session served where its prefix is
 * cached (`a`), its later turns sent to the warmed node (`session`); or a node never measured,
 * the request served on a measured one (`explore`). Counted on the node as any attempt, so that
 * routing and admission see its load, and its first chunk teaches the policy the node's prefill
 * rate as a request's does (a node never measured is measured by it, before a client's request
 * pays for finding it slow). Only OpenAI-compatible chat and completions routes (the config keeps
 * `warm_sessions` off elsewhere); at most MAX_WARMING at once; never waits for, nor fails, the
 * request. Declined (a session stays where `a` is served) when it cannot be sent.
 */
function warmUp<T>(deps: UpstreamDeps, d: Dispatch<T>, warm: Warmup, a: Attempt): void {
  const { candidate: c, reason } = warm
  const { route } = c
  let body: string | undefined
  try {
    if (route.provider === 'openai' && d.path !== '/embeddings' && warming < MAX_WARMING)
      body = warmupBody(d.body(route))
  } catch {
    body = undefined
  }
  if (body === undefined) {
    deps.policy.declineWarmup?.(a)
    return
  }
  warming++
  const nowMs = Date.now()
  deps.pool.begin(c.node, nowMs)
  const w = new Attempt(c, { ...a.req, session: undefined, stream: true, exclude: new Set() }, nowMs)
  w.warmup = true
  deps.policy.started(w)
  deps.warmups?.sent(reason)
  const controller = new AbortController()
  // One token: the whole answer is due by the first-byte deadline.
  const timeoutMs = route.firstByteTimeoutMs ?? deps.timeouts.firstByteTimeoutMs
  const deadline = deps.watchdog.watch(nowMs + timeoutMs, () =>
    controller.abort(new UpstreamTimeout('the warm-up timed out')),
  )
  void (async () => {
    let outcome: Outcome = 'failed'
    let warmed = false
    let cached: number | undefined
    try {
      const reply = await deps.adapter.send(
        { route, path: d.path, body, stream: true, traceparent: undefined },
        controller,
        nowMs + timeoutMs,
      )
      const reader = replyReader(reply)
      const decoder = new TextDecoder()
      let text = ''
      for (let first = true; reader !== undefined; first = false) {
        const { done, value } = await reader.read()
        if (done) break
        if (first) {
          // An error as its first event (inside a 200 stream) is a failure, as for a request.
          if (ERROR_EVENT.test(decoder.decode(value.subarray(0, 64))))
            throw new UpstreamFailed(`${c.node.name} answered a warm-up with an error`)
          deps.policy.firstChunk(w, Date.now())
        }
        // The usage comes last; a bounded tail of the stream keeps it.
        text = (text + decoder.decode(value, { stream: true })).slice(-16_384)
      }
      outcome = 'ok'
      warmed = true
      const n = Number(/"cached_tokens"\s*:\s*(\d+)/.exec(text)?.[1])
      if (Number.isFinite(n)) cached = n
    } catch (err) {
      // A refusal is an answer (the node is well; the body is what it refused); an overload or
      // a failure is the node's, as for a request's attempt; no answer by the first-byte
      // deadline leaves the node suspect of a stall (its next first token clears it).
      const timedOut = controller.signal.aborted && controller.signal.reason instanceof UpstreamTimeout
      outcome =
        err instanceof UpstreamRejected
          ? 'ok'
          : timedOut || err instanceof UpstreamTimeout
            ? 'cancelled'
            : err instanceof UpstreamFailed
              ? failedOutcome(err)
              : 'failed'
      deps.log(err instanceof UpstreamRejected ? 'warn' : 'debug', 'a warm-up failed', {
        node: c.node.name,
        reason,
        error: (err as Error).message,
      })
    } finally {
      deps.watchdog.clear(deadline)
      // Whatever is left of the answer (an error event read first, say) is not read: stop it.
      if (!warmed) controller.abort(new Error('the warm-up ended'))
      warming--
      deps.warmups?.ended(reason, warmed)
      finishAttempt(deps, w, outcome, cached)
      // Not warmed: the session goes back to where its first turn was served, if it is still
      // bound for this node.
      if (!warmed && reason === 'session') deps.policy.declineWarmup?.(a, c.node)
    }
  })()
}

/**
 * No node is predicted to give the first token within the request's budget: a 429 the client
 * can act on at once (another model, a smaller prompt, or a retry once the queue has drained:
 * retry-after is the predicted overshoot, at least 1 s).
 */
function overBudget(budgetMs: number, predictedMs: number): RateLimited {
  return new RateLimited(
    `no node is predicted to answer within the TTFT budget of ${budgetMs} ms (the best predicts ${Math.ceil(predictedMs)} ms)`,
    Math.max(1, Math.ceil((predictedMs - budgetMs) / 1000)),
    'ttft_budget_unmet',
  )
}

/** The next attempt to settle, or 'hedge' when the hedge time comes first. */
function next<T>(
  running: Map<Attempt, Running<T>>,
  hedgeAtMs: number | undefined,
): Promise<Settled<T> | 'hedge'> {
  if (hedgeAtMs === undefined && running.size === 1) return running.values().next().value!.done
  const dones = [...running.values()].map((r) => r.done)
  if (hedgeAtMs === undefined) return Promise.race(dones)
  let timer: ReturnType<typeof setTimeout> | undefined
  const hedge = new Promise<'hedge'>((resolve) => {
    timer = setTimeout(() => resolve('hedge'), Math.max(0, hedgeAtMs - Date.now()))
  })
  return Promise.race([...dones, hedge]).finally(() => clearTimeout(timer))
}

/** Reads a whole body under the deadline; a broken or late body is a node failure. */
export async function readBody(reply: UpstreamReply, deps: UpstreamDeps, node: string): Promise<string> {
  const deadline = deps.watchdog.watch(Date.now() + deps.timeouts.idleTimeoutMs, () =>
    reply.abort(new UpstreamFailed(`${node} did not finish its response in time`)),
  )
  try {
    return await reply.response.text()
  } catch (err) {
    if (err instanceof UpstreamFailed) throw err
    throw new UpstreamFailed(`${node} broke off its response`, 'upstream_error', null, (err as Error).message)
  } finally {
    deps.watchdog.clear(deadline)
  }
}
