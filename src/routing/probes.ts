import type { ModelConfig } from '../config/load.ts'
import type { NodePool, NodeState } from './nodes.ts'
import type { NodeMetrics, RoutingPolicy } from './policy.ts'

interface Target {
  readonly node: NodeState
  readonly modelsUrl: string
  readonly metricsUrl: string
  readonly apiKey: string | undefined
  failedChecks: number
  /** No metrics there (404, not Prometheus): ask again only after this time. */
  metricsMutedUntilMs: number
}

export interface ProbeOptions {
  /** Active health checks every this many ms; 0: off. */
  readonly healthCheckMs: number
  /** /metrics polls every this many ms; 0: off. */
  readonly metricsPollMs: number
  readonly timeoutMs: number
  readonly log: (
    level: 'debug' | 'info' | 'warn' | 'error',
    msg: string,
    fields?: Record<string, unknown>,
  ) => void
}

/** Consecutive failed checks that eject a node, and for how long. */
const EJECT_AFTER_CHECKS = 2
const CHECK_EJECT_MS = 5_000

/**
 * Active health checks and load polling of upstream nodes.
 *
 * Health: `GET <base_url>/models` (every OpenAI-compatible server has it, hosted ones too) every
 * `healthCheckMs`. Two failures in a row (refused, non-2xx, or no answer within the connect
 * timeout: a hung node) eject the node; a success ends a running ejection early, so the node
 * comes back through the gradual return rather than waiting out its back-off.
 *
 * Load: the node's Prometheus `/metrics` (vLLM: num_requests_waiting/running, kv or gpu cache
 * usage; llama.cpp: requests_deferred/processing, kv_cache_usage_ratio) every `metricsPollMs`,
 * handed to the routing policy. Nodes without metrics are asked again once a minute.
 */
export class NodeProbes {
  private targets: Target[] = []
  private healthTimer: ReturnType<typeof setInterval> | undefined
  private metricsTimer: ReturnType<typeof setInterval> | undefined
  private stopped = false

  constructor(
    pool: NodePool,
    private readonly policy: RoutingPolicy,
    models: readonly ModelConfig[],
    private readonly opts: ProbeOptions,
  ) {
    this.retarget(pool, models)
  }

  /** The nodes of a reloaded config; a node that stays keeps its count of failed checks. */
  retarget(pool: NodePool, models: readonly ModelConfig[]): void {
    const before = new Map(this.targets.map((t) => [t.node, t]))
    this.targets = []
    const seen = new Set<NodeState>()
    for (const m of models)
      for (const c of pool.candidates(m.id)) {
        // Hosted providers' APIs (Anthropic, Gemini, ...) are judged by their answers alone: their
        // model lists need their own auth and say nothing of one node's health.
        if (seen.has(c.node) || c.route.provider !== 'openai') continue
        seen.add(c.node)
        const kept = before.get(c.node)
        this.targets.push({
          node: c.node,
          modelsUrl: `${c.route.baseUrl}/models`,
          metricsUrl: c.route.metricsUrl,
          apiKey: c.route.apiKey,
          failedChecks: kept?.failedChecks ?? 0,
          metricsMutedUntilMs: kept?.metricsMutedUntilMs ?? 0,
        })
      }
  }

  start(): void {
    if (this.opts.healthCheckMs > 0) {
      this.healthTimer = setInterval(() => void this.checkAll(), this.opts.healthCheckMs)
      this.healthTimer.unref?.()
    }
    if (this.opts.metricsPollMs > 0 && this.policy.nodeMetrics) {
      this.metricsTimer = setInterval(() => void this.pollAll(), this.opts.metricsPollMs)
      this.metricsTimer.unref?.()
    }
  }

  stop(): void {
    this.stopped = true
    clearInterval(this.healthTimer)
    clearInterval(this.metricsTimer)
  }

  /** One round of health checks (also called by tests). */
  async checkAll(): Promise<void> {
    await Promise.all(this.targets.map((t) => this.check(t)))
  }

  /** One round of metrics polls. */
  async pollAll(): Promise<void> {
    const nowMs = Date.now()
    await Promise.all(this.targets.filter((t) => nowMs >= t.metricsMutedUntilMs).map((t) => this.poll(t)))
  }

  private async check(t: Target): Promise<void> {
    let ok = false
    try {
      const res = await fetch(t.modelsUrl, {
        headers: t.apiKey ? { authorization: `Bearer ${t.apiKey}` } : {},
        signal: AbortSignal.timeout(this.opts.timeoutMs),
      })
      ok = res.ok
      await res.body?.cancel().catch(() => {})
    } catch {
      ok = false
    }
    if (this.stopped) return
    const node = t.node
    const nowMs = Date.now()
    if (ok) {
      t.failedChecks = 0
      if (nowMs < node.ejectedUntilMs) {
        node.ejectedUntilMs = nowMs
        this.opts.log('info', 'node passed its health check; returning gradually', { node: node.name })
      }
      return
    }
    t.failedChecks++
    if (t.failedChecks >= EJECT_AFTER_CHECKS && nowMs >= node.ejectedUntilMs) {
      node.eject(nowMs, CHECK_EJECT_MS)
      this.opts.log('warn', 'node failed its health checks; ejected', {
        node: node.name,
        checks: t.failedChecks,
      })
    }
  }

  private async poll(t: Target): Promise<void> {
    try {
      const res = await fetch(t.metricsUrl, {
        headers: t.apiKey ? { authorization: `Bearer ${t.apiKey}` } : {},
        signal: AbortSignal.timeout(this.opts.timeoutMs),
      })
      if (!res.ok) await res.body?.cancel().catch(() => {})
      const m = res.ok ? parseNodeMetrics(await res.text()) : undefined
      if (!m) {
        t.metricsMutedUntilMs = Date.now() + 60_000
        return
      }
      if (!this.stopped) this.policy.nodeMetrics?.(t.node, m, Date.now())
    } catch {
      // Unreachable: the health check deals with that.
    }
  }
}

const WAITING = new Set(['vllm:num_requests_waiting', 'llamacpp:requests_deferred'])
const RUNNING = new Set(['vllm:num_requests_running', 'llamacpp:requests_processing'])
const KV = new Set(['vllm:gpu_cache_usage_perc', 'vllm:kv_cache_usage_perc', 'llamacpp:kv_cache_usage_ratio'])
/** vLLM's cache configuration, a gauge of 1 whose labels carry the figures (`num_gpu_blocks`). */
const CACHE_CONFIG = 'vllm:cache_config_info'
const GPU_BLOCKS = /[{,]\s*num_gpu_blocks="(\d+)"/

/**
 * The load figures of a vLLM or llama.cpp Prometheus page, summed over label sets (one node
 * may serve several models), and vLLM's KV-cache size in blocks; undefined when the page has no
 * load figure.
 */
export function parseNodeMetrics(text: string): NodeMetrics | undefined {
  let waiting = 0
  let running = 0
  let kv: number | undefined
  let cacheBlocks: number | undefined
  let found = false
  for (const line of text.split('\n')) {
    if (line === '' || line.charCodeAt(0) === 35 /* # */) continue
    const nameEnd = line.search(/[{ ]/)
    if (nameEnd <= 0) continue
    const name = line.slice(0, nameEnd)
    if (name === CACHE_CONFIG) {
      // One line per engine (data parallel): the node's cache is their sum.
      const blocks = Number(GPU_BLOCKS.exec(line)?.[1])
      if (blocks > 0 && Number.isSafeInteger(blocks)) cacheBlocks = (cacheBlocks ?? 0) + blocks
      continue
    }
    const isW = WAITING.has(name)
    const isR = RUNNING.has(name)
    const isK = KV.has(name)
    if (!isW && !isR && !isK) continue
    const rest = line.includes('}') ? line.slice(line.lastIndexOf('}') + 1) : line.slice(nameEnd)
    const valueText = rest.trim().split(/\s+/)[0] ?? ''
    const value = Number(valueText)
    if (!Number.isFinite(value)) continue
    found = true
    if (isW) waiting += value
    else if (isR) running += value
    else kv = Math.max(kv ?? 0, value)
  }
  if (!found) return undefined
  return cacheBlocks === undefined
    ? { waiting, running, kvUsage: kv }
    : { waiting, running, kvUsage: kv, cacheBlocks }
}
