import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config/load.ts'
import { buildServices, consoleLog, type Services } from '../../src/services.ts'
import { type SimNode, type SimNodeOptions, startSimFleet } from '../../src/simulator/index.ts'
import { openStore } from '../../src/storage/open.ts'
import { freshPgDatabase } from './pg.ts'
import { ADMIN_TOKEN, defaultModels } from './start.ts'

export interface ClusterNode {
  readonly url: string
  readonly svc: Services
}

/** `n` router nodes in this process on their own ports, sharing a fresh PostgreSQL database and a Redis prefix. */
export async function startCluster(
  n: number,
  sim: SimNodeOptions[] = [1, 2].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })),
  /** Extra config sections for every node (webhooks, ...). */
  extra: Record<string, unknown> = {},
) {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-cluster-'))
  const pg = await freshPgDatabase()
  const fleet = await startSimFleet(sim)
  const prefix = `tropa-test-${process.pid}-${Date.now().toString(36)}:`
  const configPath = join(dir, 'tropa.json')
  writeFileSync(
    configPath,
    JSON.stringify({
      server: { port: 0, data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'error' },
      storage: { kind: 'postgres', postgres_url: pg.url, flush_interval_ms: 10 },
      redis: {
        url: process.env.TROPA_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379',
        prefix,
        revocation_bound_ms: 500,
      },
      ...extra,
      models: defaultModels(fleet.nodes as SimNode[]),
    }),
  )
  const nodes: (ClusterNode & { stop(): Promise<void> })[] = []
  for (let i = 0; i < n; i++) {
    const config = loadConfig({ configPath }, {})
    const store = await openStore(config.storage)
    const svc = await buildServices(config, store, consoleLog('error'))
    const app = createApp(svc).listen({ port: 0, hostname: '127.0.0.1' })
    nodes.push({
      url: `http://127.0.0.1:${app.server!.port}`,
      svc,
      async stop() {
        await app.stop(true)
        await svc.stop()
        await store.close()
      },
    })
  }
  return {
    nodes,
    sim: fleet.nodes,
    /** The cluster's PostgreSQL database. */
    pgUrl: pg.url,
    /** Its Redis key prefix. */
    prefix,
    async stop() {
      for (const node of nodes) await node.stop()
      await fleet.stop()
      await pg.drop()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

export const call = (url: string, path: string, token: string, body?: unknown, method?: string) =>
  fetch(`${url}${path}`, {
    method: method ?? (body === undefined ? 'GET' : 'POST'),
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  })
