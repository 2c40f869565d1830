import { afterAll, beforeAll, expect, test } from 'bun:test'
import { SQL } from 'bun'
import { rubNumberToNano } from '../../src/billing/money.ts'
import { call, startCluster } from '../helpers/cluster.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'

// Every node shows the cluster's money, not its own copy: an organization's balance and its keys'
// spend include every node's charges, written to PostgreSQL or not. While the test holds a lock
// on the ledger table no node can write its rows, so a node that showed its own copy, or only
// what PostgreSQL has, would be caught.
let cluster: Awaited<ReturnType<typeof startCluster>>
beforeAll(async () => {
  cluster = await startCluster(3)
})

/** Runs `f` while no node can write ledger rows (reads go on). */
async function withLedgerHeld<T>(f: () => Promise<T>): Promise<T> {
  const sql = new SQL(cluster.pgUrl)
  try {
    return await sql.begin(async (tx) => {
      await tx`LOCK TABLE ledger IN SHARE MODE`
      return f()
    })
  } finally {
    await sql.close()
  }
}
afterAll(() => cluster.stop())

const messages = [{ role: 'user' as const, content: 'Count to ten, please.' }]
const nano = (rub: number) => rubNumberToNano(rub)!
const json = async <T>(res: Promise<Response>) => (await (await res).json()) as T
type Org = { id: string; master_key: string; balance_rub: number; reserved_rub: number }
type Key = { key_id: string; key: string; spent_rub: number; limit_rub: number | null }

async function newOrg(name: string) {
  const nodes = cluster.nodes
  const org = await json<Org>(
    call(nodes[0]!.url, '/v1/admin/organizations', ADMIN_TOKEN, { name, balance_rub: 100 }),
  )
  const free = await json<Key>(call(nodes[1]!.url, '/v1/keys', org.master_key, { name: 'free' }))
  const capped = await json<Key>(
    call(nodes[2]!.url, '/v1/keys', org.master_key, { name: 'capped', limit_rub: 50 }),
  )
  await Bun.sleep(50) // the new keys' events reach every node
  return { org, free, capped }
}

/** `n` requests in waves of 150 (Bun's fetch holds at most 256 connections at once, upstream calls included). */
async function spend(keys: string[], n: number) {
  for (let done = 0; done < n; done += 150) await wave(keys, done, Math.min(150, n - done))
}

async function wave(keys: string[], from: number, n: number) {
  const statuses = await Promise.all(
    Array.from({ length: n }, async (_, j) => {
      const i = from + j
      const res = await call(cluster.nodes[i % 3]!.url, '/v1/chat/completions', keys[i % keys.length]!, {
        model: 'test/chat',
        messages,
        max_tokens: 12,
        stream: i % 2 === 1,
        seed: i,
      })
      await res.arrayBuffer()
      return res.status
    }),
  )
  expect(statuses.every((s) => s === 200)).toBe(true)
}

/** What each node shows: the organization, and each key's spend by id. */
async function shownByEveryNode(org: Org) {
  return Promise.all(
    cluster.nodes.map(async (n) => {
      const o = await json<Org>(call(n.url, '/v1/organization', org.master_key))
      const keys = await json<{ data: Key[] }>(call(n.url, '/v1/keys', org.master_key))
      const admin = await json<Org>(call(n.url, `/v1/admin/organizations/${org.id}`, ADMIN_TOKEN))
      return {
        balance: nano(o.balance_rub),
        reserved: nano(o.reserved_rub),
        adminBalance: nano(admin.balance_rub),
        spent: Object.fromEntries(keys.data.map((k) => [k.key_id, nano(k.spent_rub)])),
      }
    }),
  )
}

test('300 requests over three nodes, nothing flushed: every node shows the same balance and spend, and the ledger agrees once written', async () => {
  const { org, free, capped } = await newOrg('standing')
  const store = cluster.nodes[0]!.svc.store
  // A key's first request builds its shared room from PostgreSQL after a flush: not under the lock.
  await spend([free.key, capped.key], 2)
  for (const n of cluster.nodes) await n.svc.ledger.flush()
  const written = (await store.getOrg(org.id))!.balanceNano
  expect(written).toBeLessThan(100_000_000_000n)
  const shown = await withLedgerHeld(async () => {
    await spend([free.key, capped.key], 300)
    const seen = await shownByEveryNode(org)
    // Nothing more is written yet: PostgreSQL still has the balance before these requests.
    expect((await store.getOrg(org.id))!.balanceNano).toBe(written)
    return seen
  })
  for (const s of shown) expect(s).toEqual(shown[0]!)
  const first = shown[0]!
  expect(first.reserved).toBe(0n)
  expect(first.adminBalance).toBe(first.balance)

  for (const n of cluster.nodes) await n.svc.ledger.flush()
  const rows = await store.ledgerForOrg(org.id, 0, Date.now() + 1000)
  const usage = rows.filter((r) => r.kind === 'usage')
  expect(usage).toHaveLength(302)
  // /v1/usage (which writes the ledger before it reads) shows the same balance.
  for (const n of cluster.nodes) {
    const u = await json<{ balance_rub: number }>(call(n.url, '/v1/usage', org.master_key))
    expect(nano(u.balance_rub)).toBe(first.balance)
  }
  const sumOf = (keyId: string) => usage.filter((r) => r.keyId === keyId).reduce((s, r) => s + r.costNano, 0n)
  const total = sumOf(free.key_id) + sumOf(capped.key_id)
  expect(first.balance).toBe(100_000_000_000n - total)
  expect((await store.getOrg(org.id))!.balanceNano).toBe(first.balance)
  expect(first.spent[free.key_id]!).toBe(sumOf(free.key_id))
  expect(first.spent[capped.key_id]!).toBe(sumOf(capped.key_id))
  expect((await store.getKey(capped.key_id))!.spentNano).toBe(sumOf(capped.key_id))
  // One key's own page, on a node that served a third of its requests.
  const one = await json<Key>(call(cluster.nodes[1]!.url, `/v1/keys/${free.key_id}`, org.master_key))
  expect(nano(one.spent_rub)).toBe(sumOf(free.key_id))
}, 60_000)

test('a key given a limit after spending, then none, then one again: the limit counts what it spent on every node', async () => {
  const { org, free } = await newOrg('relimit')
  await spend([free.key], 30)
  const spent = (await shownByEveryNode(org))[0]!.spent[free.key_id]!
  expect(spent).toBeGreaterThan(0n)
  const limitTo = async (limit_rub: number | null) => {
    const res = await call(
      cluster.nodes[2]!.url,
      `/v1/keys/${free.key_id}`,
      org.master_key,
      { limit_rub },
      'PATCH',
    )
    expect(res.status).toBe(200)
    await Bun.sleep(50)
  }
  // A limit just above what was spent: room for a request or two, never the 30 asked.
  const cost = spent / 30n
  await limitTo(Number(spent + cost * 2n) / 1e9)
  await limitTo(null)
  await limitTo(Number(spent + cost * 2n) / 1e9)
  const statuses = await Promise.all(
    Array.from({ length: 30 }, async (_, i) => {
      const res = await call(cluster.nodes[i % 3]!.url, '/v1/chat/completions', free.key, {
        model: 'test/chat',
        messages,
        max_tokens: 12,
        seed: 1000 + i,
      })
      await res.arrayBuffer()
      return res.status
    }),
  )
  const ok = statuses.filter((s) => s === 200).length
  expect(statuses.filter((s) => s === 402).length).toBe(30 - ok)
  expect(ok).toBeLessThanOrEqual(3)
  const after = await shownByEveryNode(org)
  for (const s of after) expect(s.spent[free.key_id]!).toBe(after[0]!.spent[free.key_id]!)
  const shownKey = await json<Key>(call(cluster.nodes[0]!.url, `/v1/keys/${free.key_id}`, org.master_key))
  expect(nano(shownKey.spent_rub)).toBeLessThanOrEqual(nano(shownKey.limit_rub!))
}, 60_000)
