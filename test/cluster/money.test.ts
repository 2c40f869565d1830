import { afterAll, beforeAll, expect, test } from 'bun:test'
import { costNano, nanoToRubNumber, parseRub, rubNumberToNano } from '../../src/billing/money.ts'
import type { SharedMeter } from '../../src/billing/shared-meter.ts'
import { countChatPrompt, loadTokenizer, reservedPromptTokens } from '../../src/pipeline/tokens.ts'
import { call, startCluster } from '../helpers/cluster.ts'
import { ADMIN_TOKEN, CHAT_PRICE } from '../helpers/start.ts'

// The overspend test of the money issue, spread over three nodes sharing PostgreSQL and Redis.
let cluster: Awaited<ReturnType<typeof startCluster>>
beforeAll(async () => {
  cluster = await startCluster(
    3,
    [1, 2].map((i) => ({ name: `sim-${i}`, itlMs: 2, iterationOverheadMs: 1, seed: i })),
  )
})
afterAll(() => cluster.stop())

const messages = [{ role: 'user' as const, content: 'Count to twenty, please.' }]
const MAX_TOKENS = 20

test('300 concurrent requests over three nodes on a key that fits about 30: never over the limit, ledger = spent = balance drop', async () => {
  await loadTokenizer()
  const price = {
    promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
    completionNano: parseRub(CHAT_PRICE.completion, 6)!,
  }
  const worst = costNano(reservedPromptTokens(countChatPrompt(messages, undefined)), MAX_TOKENS, price)
  const limitNano = worst * 30n
  const nodes = cluster.nodes
  const org = (await (
    await call(nodes[0]!.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'money', balance_rub: 100 })
  ).json()) as {
    id: string
    master_key: string
  }
  const key = (await (
    await call(nodes[1]!.url, '/v1/keys', org.master_key, {
      name: 'tight',
      limit_rub: nanoToRubNumber(limitNano),
    })
  ).json()) as {
    key: string
    key_id: string
  }
  await Bun.sleep(50) // the new key's event reaches every node
  const statuses = await Promise.all(
    Array.from({ length: 300 }, async (_, i) => {
      const node = nodes[i % 3]!
      const stream = i % 2 === 1
      const res = await call(node.url, '/v1/chat/completions', key.key, {
        model: 'test/chat',
        messages,
        max_tokens: MAX_TOKENS,
        stream,
        seed: i,
      })
      if (stream && res.status === 200 && i % 10 === 1) {
        await res.body!.getReader().read()
        await res.body!.cancel().catch(() => {})
      } else await res.arrayBuffer()
      return res.status
    }),
  )
  await Bun.sleep(200)
  for (const n of nodes) await n.svc.ledger.flush()
  const ok = statuses.filter((s) => s === 200).length
  const refused = statuses.filter((s) => s === 402).length
  expect(ok + refused).toBe(300)
  expect(ok).toBeGreaterThanOrEqual(25)
  expect(cluster.sim.reduce((s, n) => s + n.stats().chatRequests, 0)).toBe(ok)
  const store = nodes[0]!.svc.store
  const rec = (await store.getKey(key.key_id))!
  expect(rec.spentNano).toBeLessThanOrEqual(limitNano)
  const ledger = (await store.ledgerForOrg(org.id, 0, Date.now() + 1000)).filter(
    (r) => r.keyId === key.key_id,
  )
  expect(ledger).toHaveLength(ok)
  const sum = ledger.reduce((s, r) => s + r.costNano, 0n)
  expect(rec.spentNano).toBe(sum)
  expect(100_000_000_000n - (await store.getOrg(org.id))!.balanceNano).toBe(sum)
  const shown = (await (await call(nodes[2]!.url, `/v1/keys/${key.key_id}`, org.master_key)).json()) as {
    spent_rub: number
  }
  expect(rubNumberToNano(shown.spent_rub)).toBe(sum)
  console.log(
    `three nodes: ${ok} admitted, ${refused} refused with 402; spent ${nanoToRubNumber(sum)} of ${nanoToRubNumber(limitNano)} RUB`,
  )
}, 60_000)

test("one turn's reservations and settlements reach Redis together, each checked and taken exactly as alone", async () => {
  const [a, b] = cluster.nodes
  const meterA = a!.svc.deps.meter as SharedMeter
  const meterB = b!.svc.deps.meter as SharedMeter
  const unit = 1_000_000n // 0.001 RUB
  const org = (await (
    await call(a!.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'turns', balance_rub: 1 })
  ).json()) as { id: string; master_key: string }
  const made = async (body: Record<string, unknown>) =>
    (await (await call(a!.url, '/v1/keys', org.master_key, body)).json()) as { key_id: string }
  // Room for exactly 10 units on the limited key, 6 in the budgeted key's day, 30 on the unlimited one.
  const limited = await made({ name: 'limited', limit_rub: nanoToRubNumber(10n * unit) })
  const budgeted = await made({
    name: 'budgeted',
    budget: { amount_rub: nanoToRubNumber(6n * unit), period: 'day' },
  })
  const open = await made({ name: 'open' })
  await Bun.sleep(50) // the keys' events reach node B
  const live = (node: typeof a, id: string) => node!.svc.identity.keyById(id)!
  const liveOrg = (node: typeof a) => node!.svc.identity.org(org.id)

  // 60 reservations in one turn of node A's loop and 20 on node B: each decided in order.
  const tries = (node: typeof a, meter: SharedMeter, n: number) =>
    Array.from({ length: n }, (_, i) => {
      const id = [limited, budgeted, open][i % 3]!.key_id
      return Promise.resolve(meter.reserve(live(node, id), liveOrg(node), unit)).then(
        (r) => ({ id, r }),
        (err: { code?: string }) => ({ id, err: err.code }),
      )
    })
  // The rooms' first use: 15 reservations in one turn find them missing and rebuild each once
  // (the key rooms; the organization's room follows).
  const scripts = meterA as unknown as {
    run: (name: string, keys: string[], args: string[]) => Promise<string>
  }
  const run = scripts.run.bind(meterA)
  const rebuilt: string[] = []
  scripts.run = (name, keys, args) => {
    if (name === 'REBUILD') rebuilt.push(keys[0]!)
    return run(name, keys, args)
  }
  const first = await Promise.all(
    Array.from({ length: 15 }, (_, i) =>
      meterA.reserve(live(a, [limited, budgeted, open][i % 3]!.key_id), liveOrg(a), unit),
    ),
  )
  scripts.run = run
  for (const r of first) meterA.release(r)
  expect(rebuilt.filter((room) => room.includes(':room:key:')).sort()).toEqual(
    [limited, budgeted, open].map((x) => `${cluster.prefix}room:key:${x.key_id}`).sort(),
  )
  expect(rebuilt.filter((room) => room.includes(':room:org:'))).toHaveLength(1)
  // Node A's calls to Redis, counted: the 60 go in one call (or a few, if a tick comes between).
  const client = (meterA as unknown as { redis: { send: (cmd: string, args: string[]) => Promise<unknown> } })
    .redis
  const send = client.send.bind(client)
  let callsA = 0
  client.send = (cmd, args) => {
    callsA++
    return send(cmd, args)
  }
  const results = await Promise.all([...tries(a, meterA, 60), ...tries(b, meterB, 20)])
  client.send = send
  expect(callsA).toBeLessThan(6)
  const admitted = (id: string) => results.filter((x) => x.id === id && 'r' in x)
  expect(admitted(limited.key_id)).toHaveLength(10) // of 27 tries
  expect(admitted(budgeted.key_id)).toHaveLength(6) // of 27
  expect(admitted(open.key_id)).toHaveLength(26) // all
  const codes = new Set(results.filter((x) => 'err' in x).map((x) => (x as { err?: string }).err))
  expect([...codes].sort()).toEqual(['key_budget_exhausted', 'key_limit_reached'])

  // Settled in one turn on each node, each charging a different part of its hold; half released.
  let charged = 0n
  let k = 0
  for (const [node, meter] of [
    [a, meterA],
    [b, meterB],
  ] as const) {
    const mine = results.slice(node === a ? 0 : 60, node === a ? 60 : 80)
    for (const x of mine) {
      if (!('r' in x)) continue
      k++
      if (k % 2 === 0) meter.release(x.r)
      else {
        const cost = (unit * BigInt(k % 7)) / 7n
        charged += meter.settle(x.r, {
          requestId: `turn-${k}`,
          model: 'test/chat',
          node: 'sim-1',
          promptTokens: 1,
          completionTokens: 1,
          costNano: cost,
          batchId: null,
          startedAtMs: Date.now(),
          endedAtMs: Date.now(),
          outcome: 'ok',
          estimated: false,
        })
      }
    }
  }
  // Every hold is gone from Redis and the rooms are exactly what was charged.
  const keys = [limited, budgeted, open].map((x) => live(b, x.key_id))
  let after = await meterB.standing(liveOrg(b), keys)
  // Settlements are sent at the end of their turn, without a reply awaited: read until both nodes' are in.
  for (let i = 0; i < 50 && after.reservedNano !== 0n; i++) {
    await Bun.sleep(20)
    after = await meterB.standing(liveOrg(b), keys)
  }
  expect(after.reservedNano).toBe(0n)
  expect(after.balanceNano).toBe(1_000_000_000n - charged)
  const spent = [...after.spentNano.values()].reduce((s, v) => s + v, 0n)
  expect(spent).toBe(charged)
})
