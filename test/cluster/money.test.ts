import { afterAll, beforeAll, expect, test } from 'bun:test'
import { costNano, nanoToRubNumber, parseRub, rubNumberToNano } from '../../src/billing/money.ts'
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
