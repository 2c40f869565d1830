import type { Config, ModelConfig, RouteConfig } from '../config/load.ts'
import { NoUpstreamAvailable, UpstreamFailed, UpstreamRejected } from '../errors.ts'
import type { Candidate, NodePool } from '../routing/nodes.ts'
import type { RoutingPolicy } from '../routing/policy.ts'
import type { UpstreamAdapter, UpstreamReply } from '../upstream/adapter.ts'
import { probeConnect } from '../upstream/connect-probe.ts'
import type { Watchdog } from '../upstream/watchdog.ts'

/** What the pipelines need to reach upstreams. */
export interface UpstreamDeps {
  readonly pool: NodePool
  readonly policy: RoutingPolicy
  readonly adapter: UpstreamAdapter
  readonly watchdog: Watchdog
  readonly timeouts: Config['upstream']
  readonly log: (
    level: 'debug' | 'info' | 'warn' | 'error',
    msg: string,
    fields?: Record<string, unknown>,
  ) => void
}

export interface Dispatch<T> {
  readonly model: ModelConfig
  readonly path: '/chat/completions' | '/embeddings'
  readonly stream: boolean
  readonly promptTokens: number
  readonly body: (route: RouteConfig) => string
  /**
   * Takes the upstream's 2xx reply up to the point where Tropa commits to it (the first chunk of
   * a stream, the whole body otherwise). Throwing UpstreamFailed there still fails over, since
   * the client has been sent nothing yet.
   */
  readonly accept: (reply: UpstreamReply, candidate: Candidate) => Promise<T>
}

/**
 * Sends a request to the chosen node and fails over to the next best on a node failure, until
 * one node's reply is accepted or `max_attempts` nodes have been tried. The node's in-flight
 * count stays raised on success: the caller ends it when the response is done.
 */
export async function dispatch<T>(
  deps: UpstreamDeps,
  d: Dispatch<T>,
  signal: AbortSignal,
): Promise<{ value: T; candidate: Candidate }> {
  const exclude = new Set<Candidate>()
  let lastError: Error | undefined
  const candidates = deps.pool.candidates(d.model.id)
  for (let attempt = 0; attempt < deps.timeouts.maxAttempts; attempt++) {
    const nowMs = Date.now()
    const c = deps.policy.choose(candidates, {
      modelId: d.model.id,
      promptTokens: d.promptTokens,
      exclude,
      nowMs,
    })
    if (!c) break
    exclude.add(c)
    deps.pool.begin(c.node)
    try {
      if (!c.node.answering) await probeConnect(c.route.baseUrl, c.node.name, deps.timeouts.connectTimeoutMs)
      const reply = await deps.adapter.send(
        { route: c.route, path: d.path, body: d.body(c.route), stream: d.stream },
        signal,
        nowMs + deps.timeouts.firstByteTimeoutMs,
      )
      const value = await d.accept(reply, c)
      return { value, candidate: c }
    } catch (err) {
      if (signal.aborted) {
        deps.pool.end(c.node, true)
        throw signal.reason ?? err
      }
      if (err instanceof UpstreamRejected) {
        deps.pool.end(c.node, true)
        throw err
      }
      if (!(err instanceof UpstreamFailed)) {
        deps.pool.end(c.node, false)
        throw err
      }
      deps.pool.end(c.node, false)
      deps.log('warn', 'upstream attempt failed', {
        node: c.node.name,
        model: d.model.id,
        error: err.message,
        detail: err.detail,
      })
      lastError = err
    }
  }
  throw lastError ?? new NoUpstreamAvailable(d.model.id)
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
