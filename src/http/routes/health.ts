import { Elysia } from 'elysia'
import { isDiskFull } from '../../errors.ts'
import { PredictedTtft } from '../../routing/predicted.ts'
import type { Services } from '../../services.ts'

/** Which of several workers answers (docs/workers.md); undefined in a process alone. */
const WORKER = process.env.TROPA_WORKER

/** Liveness, readiness and Prometheus metrics: no authentication. */
export const healthRoutes = (svc: Services) =>
  new Elysia()
    .get(
      '/health',
      () =>
        WORKER === undefined ? { status: 'ok' } : { status: 'ok', worker: Number(WORKER), pid: process.pid },
      { detail: { tags: ['ops'], summary: 'Liveness' } },
    )
    .get(
      '/ready',
      ({ set }) => {
        // A full disk (uploads, result files or the ledger could not be written): this node cannot
        // take work that must be stored until space is freed; it turns ready again by itself.
        if (diskFull(svc)) {
          set.status = 503
          return { status: 'insufficient_storage' }
        }
        // Stopping (SIGTERM): balancers take this node out while its requests finish.
        if (svc.draining) {
          set.status = 503
          return { status: 'draining' }
        }
        // The tokenizer is not waited for: it is loaded by the first request that counts tokens.
        return { status: 'ready' }
      },
      {
        detail: {
          tags: ['ops'],
          summary: 'Readiness: 200 once listening; 503 while the disk is full or the node is stopping',
        },
      },
    )
    .get(
      '/metrics',
      async ({ set }) => {
        set.headers['content-type'] = 'text/plain; version=0.0.4'
        // Several workers: every process's series, each labelled with its worker (docs/workers.md).
        return svc.gatherMetrics ? svc.gatherMetrics() : localMetrics(svc)
      },
      { detail: { tags: ['ops'], summary: 'Prometheus metrics' } },
    )

/**
 * This process's metrics in Prometheus' text format. A worker of several leaves out what the
 * primary reports for all of them (the ledger's queue, the batches read from the store), so a sum
 * over `worker` is the whole.
 */
export async function localMetrics(svc: Services, o: { readonly worker?: boolean } = {}): Promise<string> {
  return `${metricsText(svc)}${await operationsText(svc, o.worker !== true)}`
}

/** A write found the disk full (uploads, result files, the store, the ledger) and none has succeeded since. */
const diskFull = (svc: Services) => svc.files.disk?.full !== undefined || isDiskFull(svc.ledger.lastError)

function metricsText(svc: Services): string {
  const lines = [
    '# HELP tropa_upstream_in_flight Requests in flight per upstream node.',
    '# TYPE tropa_upstream_in_flight gauge',
  ]
  const nodes = [...svc.deps.pool.nodes.values()]
  for (const n of nodes) lines.push(`tropa_upstream_in_flight{node="${n.name}"} ${n.inFlight}`)
  lines.push(
    '# HELP tropa_upstream_requests_total Requests sent per upstream node.',
    '# TYPE tropa_upstream_requests_total counter',
  )
  for (const n of nodes) lines.push(`tropa_upstream_requests_total{node="${n.name}"} ${n.requests}`)
  lines.push(
    '# HELP tropa_upstream_failures_total Failed attempts per upstream node.',
    '# TYPE tropa_upstream_failures_total counter',
  )
  for (const n of nodes) lines.push(`tropa_upstream_failures_total{node="${n.name}"} ${n.failures}`)
  lines.push(
    '# HELP tropa_upstream_ejected Whether a node is ejected now.',
    '# TYPE tropa_upstream_ejected gauge',
  )
  const now = Date.now()
  for (const n of nodes) lines.push(`tropa_upstream_ejected{node="${n.name}"} ${n.available(now) ? 0 : 1}`)
  lines.push(
    '# HELP tropa_upstream_ejections_total Times a node was ejected (breaker opened).',
    '# TYPE tropa_upstream_ejections_total counter',
  )
  for (const n of nodes) lines.push(`tropa_upstream_ejections_total{node="${n.name}"} ${n.ejections}`)
  const { hedges, retries, policy, warmups } = svc.deps
  lines.push(
    '# HELP tropa_hedges_total Requests copied to a second node because their first token was late.',
    '# TYPE tropa_hedges_total counter',
    `tropa_hedges_total ${hedges?.used ?? 0}`,
    '# HELP tropa_retries_total Attempts after the first (failover and hedges).',
    '# TYPE tropa_retries_total counter',
    `tropa_retries_total ${retries.used}`,
    '# HELP tropa_warmups_total Nodes warmed with a request\'s prompt, one token out (routes with warm_sessions): reason="session", a spread new session\'s new node; reason="explore", a node never measured.',
    '# TYPE tropa_warmups_total counter',
    `tropa_warmups_total{reason="session"} ${warmups?.sentCount.session ?? 0}`,
    `tropa_warmups_total{reason="explore"} ${warmups?.sentCount.explore ?? 0}`,
    '# HELP tropa_warmups_failed_total Warm-ups that failed (no answer, an error).',
    '# TYPE tropa_warmups_failed_total counter',
    `tropa_warmups_failed_total{reason="session"} ${warmups?.failedCount.session ?? 0}`,
    `tropa_warmups_failed_total{reason="explore"} ${warmups?.failedCount.explore ?? 0}`,
    '# HELP tropa_disk_full Whether a write found the disk full and none has succeeded since (/ready is 503).',
    '# TYPE tropa_disk_full gauge',
    `tropa_disk_full ${diskFull(svc) ? 1 : 0}`,
  )
  if (policy instanceof PredictedTtft) {
    const figures = policy.snapshot(now)
    const gauge = (name: string, help: string, pick: (f: (typeof figures)[number]) => number) => {
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`)
      for (const f of figures) lines.push(`${name}{node="${f.node}"} ${Number(pick(f).toFixed(3))}`)
    }
    gauge('tropa_node_prefill_tokens_per_second', 'Learned prefill rate (R) per node.', (f) => f.tokensPerSec)
    gauge(
      'tropa_node_slowness',
      "Factor on the node's predicted TTFT for a slowdown seen in first tokens that teach no rate (1: none).",
      (f) => f.slowness,
    )
    gauge(
      'tropa_node_queued_prompt_tokens',
      'Uncached prompt tokens sent and not yet answered (P).',
      (f) => f.queuedTokens,
    )
    gauge('tropa_node_decoding', 'Requests past their first token (D).', (f) => f.decoding)
    gauge('tropa_node_itl_ms', 'Learned inter-token latency per node.', (f) => f.itlMs)
    gauge('tropa_node_rtt_ms', 'Network round trip floor per node.', (f) => f.rttMs)
    gauge(
      'tropa_node_prefix_hit_ratio',
      'How often predicted prefix cache hits were real.',
      (f) => f.hitRatio,
    )
    gauge('tropa_node_prefix_index_blocks', 'Prefix blocks indexed per node.', (f) => f.indexBlocks)
  }
  svc.telemetry.metrics.write(lines)
  return `${lines.join('\n')}\n`
}

/** Batches not finished yet, by status (terminal ones are history: the API lists them). */
const OPEN_BATCH_STATUSES = ['validating', 'in_progress', 'finalizing', 'cancelling'] as const

/** The ledger's queue, the access log's drops, and the batches (read from the store at each scrape). */
async function operationsText(svc: Services, storeWide: boolean): Promise<string> {
  const lines: string[] = []
  const access = svc.telemetry.accessLog
  if (access)
    lines.push(
      '# HELP tropa_access_log_dropped_total Access log lines dropped because the sink fell behind.',
      '# TYPE tropa_access_log_dropped_total counter',
      `tropa_access_log_dropped_total ${access.dropped}`,
    )
  if (!storeWide) return `${lines.join('\n')}\n`
  lines.unshift(
    '# HELP tropa_ledger_queue_depth Ledger rows settled and not yet written to the store.',
    '# TYPE tropa_ledger_queue_depth gauge',
    `tropa_ledger_queue_depth ${svc.ledger.backlog}`,
  )
  try {
    const open = await svc.store.batchesInStatus(OPEN_BATCH_STATUSES)
    const byStatus = new Map<string, number>(OPEN_BATCH_STATUSES.map((s) => [s, 0]))
    let pending = 0
    for (const b of open) {
      byStatus.set(b.status, (byStatus.get(b.status) ?? 0) + 1)
      if (b.status === 'in_progress') pending += Math.max(0, b.total - b.completed - b.failed)
    }
    lines.push(
      '# HELP tropa_batches Batches not finished, by status (all nodes: read from the store).',
      '# TYPE tropa_batches gauge',
    )
    for (const [status, n] of byStatus) lines.push(`tropa_batches{status="${status}"} ${n}`)
    if (svc.batches.scheduler)
      lines.push(
        "# HELP tropa_batch_interactive_load This node's view of the fleet's interactive load, as batch admission reads it (in flight over slots).",
        '# TYPE tropa_batch_interactive_load gauge',
        `tropa_batch_interactive_load ${svc.batches.scheduler.interactiveLoad(Date.now()).toFixed(4)}`,
        "# HELP tropa_batch_interactive_demand The interactive requests that arrived over the last 0.5 s times their mean time in flight, over the fleet's slots (NaN until known; batches.fill_load).",
        '# TYPE tropa_batch_interactive_demand gauge',
        `tropa_batch_interactive_demand ${svc.batches.scheduler.interactiveDemand(Date.now()).toFixed(4)}`,
        "# HELP tropa_batch_held_nodes Nodes this node's packing plan gives a running batch whole (batches.pack_share).",
        '# TYPE tropa_batch_held_nodes gauge',
        `tropa_batch_held_nodes ${svc.batches.scheduler.heldNodes()}`,
        '# HELP tropa_batch_preempted_total Batch lines this node cancelled upstream for interactive traffic (each goes back to the queue, unbilled).',
        '# TYPE tropa_batch_preempted_total counter',
        `tropa_batch_preempted_total ${svc.batches.scheduler.preempted}`,
      )
    lines.push(
      '# HELP tropa_batch_lines_pending Lines of running batches not finished yet (all nodes).',
      '# TYPE tropa_batch_lines_pending gauge',
      `tropa_batch_lines_pending ${pending}`,
    )
  } catch (err) {
    // The store is down: the in-process metrics are still worth scraping.
    svc.log('warn', 'reading batches for /metrics failed', { error: String(err) })
  }
  return `${lines.join('\n')}\n`
}
