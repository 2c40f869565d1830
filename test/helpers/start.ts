import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI from 'openai'
import { createApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config/load.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import { buildServices, consoleLog, type Log, type Services } from '../../src/services.ts'
import { type SimNode, type SimNodeOptions, startSimFleet } from '../../src/simulator/index.ts'
import { openStore } from '../../src/storage/open.ts'
import { freshPgDatabase } from './pg.ts'

export const ADMIN_TOKEN = 'test-admin-token-0123456789'

export interface TropaOptions {
  /** Simulated upstream nodes (default: three fast ones with no delays). */
  nodes?: SimNodeOptions[]
  /** Models to serve; default: test/chat and test/embed on every node. */
  models?: (nodes: SimNode[]) => ModelFile[]
  upstream?: Record<string, number>
  /** Starting balance of the test organization, roubles. */
  balanceRub?: number
  maxBodyBytes?: number
  /** Extra keys of the server section. */
  server?: Record<string, unknown>
  /** Extra config sections (batches, files, ...). */
  extra?: Record<string, unknown>
  /** Run on a fresh PostgreSQL database instead of a SQLite file. */
  postgres?: boolean
  /** Where Tropa's log lines go (default: errors to stderr). */
  log?: Log
  /** The environment the config reads (api_key_env); default empty. */
  env?: Record<string, string>
  /** The clock of period budgets (TestHooks.clock); default Date.now. */
  clock?: () => number
}

export interface Tropa {
  readonly url: string
  readonly baseURL: string
  readonly svc: Services
  readonly nodes: SimNode[]
  readonly orgId: string
  readonly masterKey: string
  readonly apiKey: string
  readonly dir: string
  client(apiKey?: string): OpenAI
  /** Raw fetch against Tropa with the API key unless headers say otherwise. */
  fetch(path: string, init?: RequestInit & { key?: string | null }): Promise<Response>
  admin(path: string, body?: unknown, method?: string): Promise<Response>
  stop(): Promise<void>
}

export const CHAT_PRICE = { prompt: '0.000030', completion: '0.000060' }

export function defaultModels(nodes: readonly Pick<SimNode, 'name' | 'url'>[]): ModelFile[] {
  return [
    {
      id: 'test/chat',
      owned_by: 'test',
      kind: 'chat',
      context_length: 4096,
      pricing: CHAT_PRICE,
      routes: nodes.map((n) => ({
        name: n.name,
        base_url: n.url,
        upstream_model: 'chat-up',
        max_concurrency: 64,
      })),
    },
    {
      id: 'test/embed',
      owned_by: 'test',
      kind: 'embedding',
      context_length: 2048,
      dimensions: 256,
      pricing: { prompt: '0.000002', completion: '0.000000' },
      routes: nodes.map((n) => ({
        name: n.name,
        base_url: n.url,
        upstream_model: 'embed-up',
        max_concurrency: 64,
      })),
    },
  ]
}

/** Tropa on a free port, over a real SQLite file, in front of simulated nodes; with an org and keys. */
export async function startTropa(opts: TropaOptions = {}): Promise<Tropa> {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-test-'))
  const pg = opts.postgres ? await freshPgDatabase() : undefined
  const fleet = await startSimFleet(
    opts.nodes ?? [1, 2, 3].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })),
  )
  const configPath = join(dir, 'tropa.json')
  writeFileSync(
    configPath,
    JSON.stringify({
      server: {
        port: 0,
        data_dir: dir,
        admin_token: ADMIN_TOKEN,
        log_level: 'error',
        ...(opts.maxBodyBytes && { max_body_bytes: opts.maxBodyBytes }),
        ...opts.server,
      },
      upstream: { first_byte_timeout_ms: 5000, idle_timeout_ms: 5000, ...opts.upstream },
      storage: { flush_interval_ms: 10, ...(pg && { kind: 'postgres', postgres_url: pg.url }) },
      batches: { tick_ms: 50, workers: 1 },
      ...opts.extra,
      models: (opts.models ?? defaultModels)(fleet.nodes),
    }),
  )
  const config = loadConfig({ configPath }, opts.env ?? {})
  const store = await openStore(config.storage)
  const svc = await buildServices(
    config,
    store,
    opts.log ?? consoleLog('error'),
    {},
    undefined,
    opts.clock ? { clock: opts.clock } : {},
  )
  const app = createApp(svc).listen({ port: 0, hostname: '127.0.0.1' })
  const url = `http://127.0.0.1:${app.server!.port}`
  const admin = (path: string, body?: unknown, method = body === undefined ? 'GET' : 'POST') =>
    fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      ...(body !== undefined && { body: JSON.stringify(body) }),
    })
  const orgRes = await admin('/v1/admin/organizations', {
    name: 'test-org',
    balance_rub: opts.balanceRub ?? 1000,
  })
  const org = (await orgRes.json()) as { id: string; master_key: string }
  const keyRes = await fetch(`${url}/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${org.master_key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'test' }),
  })
  const key = (await keyRes.json()) as { key: string }
  const t: Tropa = {
    url,
    baseURL: `${url}/v1`,
    svc,
    nodes: fleet.nodes,
    orgId: org.id,
    masterKey: org.master_key,
    apiKey: key.key,
    dir,
    client: (apiKey = key.key) =>
      new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0, timeout: 20_000 }),
    fetch: (path, init = {}) => {
      const { key: k = key.key, ...rest } = init
      const headers = new Headers(rest.headers)
      if (k !== null && !headers.has('authorization')) headers.set('authorization', `Bearer ${k}`)
      if (typeof rest.body === 'string' && !headers.has('content-type'))
        headers.set('content-type', 'application/json')
      return fetch(`${url}${path}`, { ...rest, headers })
    },
    admin,
    async stop() {
      await app.stop(true)
      await svc.stop()
      await store.close()
      await fleet.stop()
      await pg?.drop()
      rmSync(dir, { recursive: true, force: true })
    },
  }
  return t
}

/** Creates another API key in the test org. */
export async function newApiKey(
  t: Tropa,
  body: Record<string, unknown> = { name: 'extra' },
  masterKey = t.masterKey,
): Promise<{ key: string; key_id: string }> {
  const res = await t.fetch('/v1/keys', { method: 'POST', key: masterKey, body: JSON.stringify(body) })
  if (res.status !== 201) throw new Error(`key creation failed: ${res.status} ${await res.text()}`)
  return (await res.json()) as { key: string; key_id: string }
}
