import { afterAll, beforeAll, expect, test } from 'bun:test'
import { call, startCluster } from '../helpers/cluster.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'
import { signatureValid, startReceiver, until } from '../helpers/webhook-receiver.ts'

// Two nodes on one PostgreSQL and Redis, both polling the outbox: an alert noticed by both nodes
// is written once, and each event is posted by one node.
let cluster: Awaited<ReturnType<typeof startCluster>>
beforeAll(async () => {
  cluster = await startCluster(2, undefined, {
    webhooks: { poll_ms: 20, retry_base_ms: 50, retry_max_ms: 200, allow_private_urls: true },
  })
})
afterAll(() => cluster.stop())

test('two nodes: key limits and the balance crossed from both nodes at once; each event written and delivered once', async () => {
  const [a, b] = cluster.nodes as [(typeof cluster.nodes)[0], (typeof cluster.nodes)[0]]
  const receiver = startReceiver()
  try {
    const org = (await (
      await call(a.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'alerts', balance_rub: 1 })
    ).json()) as { id: string; master_key: string }
    const hook = (await (
      await call(a.url, '/v1/webhooks', org.master_key, {
        url: receiver.url,
        events: ['key.limit_80', 'key.limit_100', 'balance.below_threshold'],
        balance_threshold_rub: 0.97,
      })
    ).json()) as { id: string; secret: string }
    const keys = await Promise.all(
      [0, 1].map(
        async (i) =>
          (await (
            await call(b.url, '/v1/keys', org.master_key, { name: `k${i}`, limit_rub: 0.03 })
          ).json()) as {
            key: string
            key_id: string
          },
      ),
    )
    // Node b learns of the webhook at its next poll, and of the keys from the bus.
    await Bun.sleep(200)
    // Per key, one client on each node, each going on until the key refused it five times in a
    // row: then the limit is spent to within one request's worst case.
    let answered = 0
    await Promise.all(
      [0, 1, 2, 3].map(async (w) => {
        const node = [a, b][w % 2]!
        const key = keys[w >> 1]!
        for (let i = 0, refusedInARow = 0; refusedInARow < 5 && i < 300; i++) {
          const res = await call(node.url, '/v1/chat/completions', key.key, {
            model: 'test/chat',
            messages: [{ role: 'user', content: `alert ${w} ${i}` }],
            max_tokens: 40,
          })
          await res.arrayBuffer()
          if (res.status === 402) refusedInARow++
          else {
            expect(res.status).toBe(200)
            answered++
            refusedInARow = 0
          }
        }
      }),
    )
    expect(answered).toBeGreaterThan(10)
    const balance = (await (await call(a.url, '/v1/organization', org.master_key)).json()) as {
      balance_rub: number
    }
    expect(balance.balance_rub).toBeLessThan(0.97)

    // 80% and 100% of two keys, and one drop of the balance.
    const types = () => [...receiver.delivered().values()].map((d) => d.type).sort()
    expect(await until(() => receiver.delivered().size >= 5)).toBe(true)
    await Promise.all(cluster.nodes.map((n) => n.svc.webhooks.settled()))
    await Bun.sleep(200) // both nodes polled again: nothing more comes
    expect(types()).toEqual([
      'balance.below_threshold',
      'key.limit_100',
      'key.limit_100',
      'key.limit_80',
      'key.limit_80',
    ])
    // Each event written once and posted by one node: no duplicates at all here.
    expect(receiver.deliveries.length).toBe(5)
    const listed = (await (await call(b.url, `/v1/webhooks/${hook.id}/events`, org.master_key)).json()) as {
      data: { id: string; status: string }[]
    }
    expect(listed.data.length).toBe(5)
    expect(listed.data.every((e) => e.status === 'delivered')).toBe(true)
    for (const d of receiver.deliveries) expect(signatureValid(hook.secret, d.signature, d.body)).toBe(true)
    const limitKeys = receiver.deliveries
      .filter((d) => d.type.startsWith('key.'))
      .map((d) => d.payload.data.key_id)
      .sort()
    // The cluster's spend (both nodes' charges), not one node's share of it.
    for (const d of receiver.deliveries.filter((x) => x.type === 'key.limit_80'))
      expect(d.payload.data.spent_rub as number).toBeGreaterThanOrEqual(0.024)
    expect(limitKeys).toEqual([keys[0]!.key_id, keys[0]!.key_id, keys[1]!.key_id, keys[1]!.key_id].sort())
  } finally {
    receiver.stop()
  }
})

test("two nodes: a key's period budget spent from both nodes; budget_80 and budget_100 once each, with the cluster's spend", async () => {
  const [a, b] = cluster.nodes as [(typeof cluster.nodes)[0], (typeof cluster.nodes)[0]]
  const receiver = startReceiver()
  try {
    const org = (await (
      await call(a.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'budget-alerts', balance_rub: 1 })
    ).json()) as { id: string; master_key: string }
    const hook = (await (
      await call(a.url, '/v1/webhooks', org.master_key, {
        url: receiver.url,
        events: ['key.budget_80', 'key.budget_100'],
      })
    ).json()) as { id: string; secret: string }
    const key = (await (
      await call(b.url, '/v1/keys', org.master_key, {
        name: 'budgeted',
        budget: { amount_rub: 0.03, period: 'month', timezone: 'Europe/Moscow' },
      })
    ).json()) as { key: string; key_id: string }
    await Bun.sleep(200)
    await Promise.all(
      [0, 1].map(async (w) => {
        const node = [a, b][w]!
        for (let i = 0, refusedInARow = 0; refusedInARow < 5 && i < 300; i++) {
          const res = await call(node.url, '/v1/chat/completions', key.key, {
            model: 'test/chat',
            messages: [{ role: 'user', content: `budget ${w} ${i}` }],
            max_tokens: 40,
          })
          const body = (await res.json()) as { error?: { code: string } }
          if (res.status === 402) {
            expect(body.error?.code).toBe('key_budget_exhausted')
            refusedInARow++
          } else {
            expect(res.status).toBe(200)
            refusedInARow = 0
          }
        }
      }),
    )
    expect(await until(() => receiver.delivered().size >= 2)).toBe(true)
    await Promise.all(cluster.nodes.map((n) => n.svc.webhooks.settled()))
    await Bun.sleep(200)
    expect([...receiver.delivered().values()].map((d) => d.type).sort()).toEqual([
      'key.budget_100',
      'key.budget_80',
    ])
    expect(receiver.deliveries.length).toBe(2)
    for (const d of receiver.deliveries) {
      expect(signatureValid(hook.secret, d.signature, d.body)).toBe(true)
      expect(d.payload.data).toMatchObject({ key_id: key.key_id, budget_rub: 0.03, period: 'month' })
    }
    const at80 = receiver.deliveries.find((d) => d.type === 'key.budget_80')!
    expect(at80.payload.data.spent_rub as number).toBeGreaterThanOrEqual(0.024)
  } finally {
    receiver.stop()
  }
})
