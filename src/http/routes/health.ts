import { Elysia } from 'elysia'
import { tokenizerReady } from '../../pipeline/tokens.ts'
import type { Services } from '../../services.ts'

/** Liveness, readiness and Prometheus metrics: no authentication. */
export const healthRoutes = (svc: Services) =>
  new Elysia()
    .get('/health', () => ({ status: 'ok' }), { detail: { tags: ['ops'], summary: 'Liveness' } })
    .get(
      '/ready',
      ({ set }) => {
        const ready = tokenizerReady()
        set.status = ready ? 200 : 503
        return { status: ready ? 'ready' : 'starting' }
      },
      { detail: { tags: ['ops'], summary: 'Readiness: 200 once requests can be served without delay' } },
    )
    .get(
      '/metrics',
      ({ set }) => {
        set.headers['content-type'] = 'text/plain; version=0.0.4'
        return metricsText(svc)
      },
      { detail: { tags: ['ops'], summary: 'Prometheus metrics' } },
    )

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
  return `${lines.join('\n')}\n`
}
