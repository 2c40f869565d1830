import { type ModelConfig, OPENAI_ROUTE } from '../../src/config/load.ts'
import { type Candidate, NodePool } from '../../src/routing/nodes.ts'

/** A node pool of `n` routes of one model (`m/x`) for policy tests; no process behind them. */
export function routeFleet(n: number, maxConcurrency = 64): { pool: NodePool; cands: readonly Candidate[] } {
  const model: ModelConfig = {
    id: 'm/x',
    ownedBy: 'm',
    kind: 'chat',
    contextLength: 100_000,
    dimensions: undefined,
    created: 0,
    price: { promptNano: 0n, completionNano: 0n, cachedPromptNano: 0n },
    fallbacks: [],
    routes: Array.from({ length: n }, (_, i) => ({
      ...OPENAI_ROUTE,
      node: `n${i}`,
      baseUrl: `http://10.0.0.${i}:8000/v1`,
      upstreamModel: 'x',
      apiKey: undefined,
      maxConcurrency,
      weight: 1,
      firstByteTimeoutMs: undefined,
      hedge: true,
      priorityScheduling: false,
      warmSessions: true,
      metricsUrl: '',
    })),
  }
  const pool = new NodePool([model])
  return { pool, cands: pool.candidates('m/x') }
}
