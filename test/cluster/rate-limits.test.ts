import { afterAll, beforeAll, expect, test } from 'bun:test'
import { countChatPrompt, loadTokenizer } from '../../src/pipeline/tokens.ts'
import { call, startCluster } from '../helpers/cluster.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'

// rpm_limit and tpm_limit hold across three nodes: the counts live in Redis, checked and taken
// in one script, so requests spread over the nodes get the same allowance as on one node.
let cluster: Awaited<ReturnType<typeof startCluster>>
let master: string
beforeAll(async () => {
  cluster = await startCluster(3)
  master = (
    (await (
      await call(cluster.nodes[0]!.url, '/v1/admin/organizations', ADMIN_TOKEN, {
        name: 'rates',
        balance_rub: 1000,
      })
    ).json()) as { master_key: string }
  ).master_key
})
afterAll(() => cluster.stop())

const messages = [{ role: 'user' as const, content: 'Say hello to the three nodes.' }]

/** Not within two seconds of a minute's end, so one test's requests fall in one window. */
async function awayFromMinuteEnd() {
  const into = Date.now() % 60_000
  if (into > 58_000) await Bun.sleep(60_000 - into + 50)
}

async function keyWith(limits: { rpm_limit?: number; tpm_limit?: number }) {
  const k = (await (
    await call(cluster.nodes[1]!.url, '/v1/keys', master, { name: 'rated', ...limits })
  ).json()) as {
    key: string
    rpm_limit: number | null
    tpm_limit: number | null
  }
  await Bun.sleep(50) // the new key's event reaches every node
  return k
}

async function hammer(key: string, n: number) {
  const chatBefore = cluster.sim.reduce((s, x) => s + x.stats().chatRequests, 0)
  const res = await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const r = await call(cluster.nodes[i % 3]!.url, '/v1/chat/completions', key, {
        model: 'test/chat',
        messages,
        max_tokens: 5,
      })
      const body = (await r.json()) as { error?: { code: string; message: string } }
      return { status: r.status, retryAfter: r.headers.get('retry-after'), body }
    }),
  )
  const upstream = cluster.sim.reduce((s, x) => s + x.stats().chatRequests, 0) - chatBefore
  return { res, upstream }
}

test('rpm_limit over three nodes: exactly the limit is admitted, the rest get 429 with Retry-After and never reach an upstream', async () => {
  const key = await keyWith({ rpm_limit: 30 })
  expect(key.rpm_limit).toBe(30)
  await awayFromMinuteEnd()
  const { res, upstream } = await hammer(key.key, 90)
  const ok = res.filter((r) => r.status === 200)
  const limited = res.filter((r) => r.status === 429)
  expect(ok).toHaveLength(30)
  expect(limited).toHaveLength(60)
  expect(upstream).toBe(30)
  for (const r of limited) {
    expect(r.body.error?.code).toBe('rate_limit_exceeded')
    expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1)
    expect(Number(r.retryAfter)).toBeLessThanOrEqual(60)
  }
})

test('tpm_limit over three nodes: the admitted prompt tokens stay within the limit', async () => {
  await loadTokenizer()
  const prompt = countChatPrompt(messages, undefined)
  const key = await keyWith({ tpm_limit: prompt * 10 + 1 })
  await awayFromMinuteEnd()
  const { res, upstream } = await hammer(key.key, 45)
  const ok = res.filter((r) => r.status === 200).length
  const limited = res.filter((r) => r.status === 429)
  expect(ok + limited.length).toBe(45)
  // Completion tokens count too (after each answer), so fewer than ten may fit; never more.
  expect(ok).toBeLessThanOrEqual(10)
  expect(ok).toBeGreaterThanOrEqual(1)
  expect(upstream).toBe(ok)
  expect(limited[0]!.body.error?.message).toContain('tokens per minute')
})

test('a key without limits is not limited on any node', async () => {
  const key = await keyWith({})
  const { res } = await hammer(key.key, 60)
  expect(res.every((r) => r.status === 200)).toBe(true)
})
