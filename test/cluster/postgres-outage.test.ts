import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { SQL } from 'bun'
import { startSimFleet } from '../../src/simulator/index.ts'
import { call } from '../helpers/cluster.ts'
import { clusterConfig, startNode, startPgServer } from '../helpers/infra.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'

// PostgreSQL (a server of this file's own, so it can be stopped) goes away under load and
// comes back: nodes keep serving keys they know, ledger rows queue in memory up to a bound
// and land exactly once when it returns; past the bound billed requests get 503 before any
// upstream call.
const REDIS_URL = process.env.TROPA_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'
const dir = mkdtempSync(join(tmpdir(), 'tropa-pg-outage-'))
const fleet = await startSimFleet([1, 2].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })))
let server: Awaited<ReturnType<typeof startPgServer>>
beforeAll(async () => {
  server = await startPgServer()
})
afterAll(async () => {
  await server.destroy()
  await fleet.stop()
  rmSync(dir, { recursive: true, force: true })
})

/** A database of one test's own on this file's server. */
async function database(): Promise<string> {
  const admin = new SQL(server.url)
  const name = `t_${Math.floor(Math.random() * 1e9)}`
  await admin.unsafe(`CREATE DATABASE ${name}`)
  await admin.close()
  const u = new URL(server.url)
  u.pathname = `/${name}`
  return u.toString()
}

const chat = { model: 'test/chat', messages: [{ role: 'user', content: 'hello' }], max_tokens: 8 }

async function setup(url: string, balanceRub = 100) {
  const org = (await (
    await call(url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'o', balance_rub: balanceRub })
  ).json()) as { id: string; master_key: string }
  const key = (await (await call(url, '/v1/keys', org.master_key, { name: 'k' })).json()) as {
    key: string
    key_id: string
  }
  return { org, key }
}

async function drained(nodes: { svc: { ledger: { backlog: number; flush(): Promise<void> } } }[]) {
  for (let i = 0; i < 300; i++) {
    for (const n of nodes) await n.svc.ledger.flush()
    if (nodes.every((n) => n.svc.ledger.backlog === 0)) return
    await Bun.sleep(50)
  }
  throw new Error('ledger queues did not drain')
}

test('PostgreSQL restarted under load: every 200 has exactly one ledger row; ledger = spent = balance drop', async () => {
  const cfg = clusterConfig({ dir, pgUrl: await database(), redisUrl: REDIS_URL, sim: fleet.nodes })
  const nodes = [await startNode(cfg.path), await startNode(cfg.path)]
  try {
    const { org, key } = await setup(nodes[0]!.url)
    await Bun.sleep(50)
    // Steady state first: each node has served the key (a room missing from Redis needs PostgreSQL).
    const done: { id: string; status: number; at: number }[] = []
    for (const n of nodes) {
      const res = await call(n.url, '/v1/chat/completions', key.key, chat)
      expect(res.status).toBe(200)
      done.push({ id: res.headers.get('x-request-id')!, status: 200, at: 0 })
    }
    let stop = false
    const t0 = performance.now()
    const load = async (i: number) => {
      while (!stop) {
        const res = await call(nodes[i % 2]!.url, '/v1/chat/completions', key.key, chat)
        await res.arrayBuffer()
        done.push({
          id: res.headers.get('x-request-id') ?? '',
          status: res.status,
          at: performance.now() - t0,
        })
      }
    }
    const workers = Array.from({ length: 8 }, (_, i) => load(i))
    await Bun.sleep(500)
    const downAt = performance.now() - t0
    server.stop()
    await Bun.sleep(1500)
    const upAt = performance.now() - t0
    await server.start()
    await Bun.sleep(700)
    stop = true
    await Promise.all(workers)
    await drained(nodes)

    const ok = done.filter((d) => d.status === 200)
    const during = ok.filter((d) => d.at > downAt && d.at < upAt).length
    expect(ok.length).toBeGreaterThan(50)
    expect(during).toBeGreaterThan(0)
    const store = nodes[0]!.svc.store
    const rows = (await store.ledgerForOrg(org.id, 0, Date.now() + 1000)).filter((r) => r.kind === 'usage')
    const ids = rows.map((r) => r.requestId).sort()
    expect(ids).toEqual(ok.map((d) => d.id).sort())
    const sum = rows.reduce((s, r) => s + r.costNano, 0n)
    expect((await store.getKey(key.key_id))!.spentNano).toBe(sum)
    expect(100_000_000_000n - (await store.getOrg(org.id))!.balanceNano).toBe(sum)
    const other = done.filter((d) => d.status !== 200)
    console.log(
      `postgres restart: ${ok.length} requests answered 200 (${during} while it was down), ${other.length} others (${[...new Set(other.map((d) => d.status))].join(',') || '-'}); ${rows.length} ledger rows, 0 lost`,
    )
  } finally {
    for (const n of nodes) await n.stop()
  }
}, 20_000)

test('PostgreSQL down: ledger rows queue up to storage.ledger_queue_max, then 503 shared_state_unavailable before any upstream call', async () => {
  const cfg = clusterConfig({
    dir,
    pgUrl: await database(),
    redisUrl: REDIS_URL,
    sim: fleet.nodes,
    storage: { ledger_queue_max: 20 },
  })
  const node = await startNode(cfg.path)
  try {
    const { org, key } = await setup(node.url)
    expect((await call(node.url, '/v1/chat/completions', key.key, chat)).status).toBe(200)
    await drained([node])
    const upstreamBefore = fleet.nodes.reduce((s, n) => s + n.stats().chatRequests, 0)

    server.stop()
    const statuses: number[] = []
    let refusal: { error: { code: string } } | undefined
    for (let i = 0; i < 40; i++) {
      const res = await call(node.url, '/v1/chat/completions', key.key, chat)
      statuses.push(res.status)
      if (res.status === 503) refusal ??= (await res.json()) as { error: { code: string } }
      else await res.arrayBuffer()
    }
    const upstreamDuring = fleet.nodes.reduce((s, n) => s + n.stats().chatRequests, 0) - upstreamBefore
    // Twenty rows queue, then every billed request is refused, and none of those reached an upstream.
    expect(statuses.slice(0, 20).every((s) => s === 200)).toBe(true)
    expect(statuses.slice(20).every((s) => s === 503)).toBe(true)
    expect(refusal?.error.code).toBe('shared_state_unavailable')
    expect(upstreamDuring).toBe(20)
    expect(node.svc.ledger.backlog).toBe(20)

    await server.start()
    await drained([node])
    expect((await call(node.url, '/v1/chat/completions', key.key, chat)).status).toBe(200)
    await drained([node])
    const rows = (await node.svc.store.ledgerForOrg(org.id, 0, Date.now() + 1000)).filter(
      (r) => r.kind === 'usage',
    )
    expect(rows).toHaveLength(22)
    console.log(
      'postgres down: 20 rows queued, requests 21-40 refused with 503, all 22 rows written on return',
    )
  } finally {
    await node.stop()
  }
}, 20_000)
