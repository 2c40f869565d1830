import { afterAll, beforeAll, expect, test } from 'bun:test'
import { call, startCluster } from '../helpers/cluster.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'

// Three router nodes sharing PostgreSQL and Redis.
let cluster: Awaited<ReturnType<typeof startCluster>>
beforeAll(async () => {
  cluster = await startCluster(3)
})
afterAll(() => cluster.stop())

const chat = { model: 'test/chat', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }

test('a key made on one node works on the others; revoked through A, it is refused by B and C from the revocation response on', async () => {
  const [a, b, c] = cluster.nodes as [
    (typeof cluster.nodes)[0],
    (typeof cluster.nodes)[0],
    (typeof cluster.nodes)[0],
  ]
  const org = (await (
    await call(a.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'cl', balance_rub: 100 })
  ).json()) as { master_key: string }
  // created on B: A and C have never seen it
  const key = (await (await call(b.url, '/v1/keys', org.master_key, { name: 'shared' })).json()) as {
    key: string
    key_id: string
  }
  for (const n of [a, b, c])
    expect((await call(n.url, '/v1/chat/completions', key.key, chat)).status).toBe(200)

  // Hammer B and C while A revokes.
  const seen: { node: string; startedAt: number; status: number }[] = []
  let stop = false
  const hammer = async (node: typeof b, name: string) => {
    while (!stop) {
      const startedAt = performance.now()
      const res = await call(node.url, '/v1/chat/completions', key.key, chat)
      await res.arrayBuffer()
      seen.push({ node: name, startedAt, status: res.status })
    }
  }
  const hammers = [hammer(b, 'B'), hammer(b, 'B'), hammer(c, 'C'), hammer(c, 'C')]
  await Bun.sleep(150)
  const revokeSent = performance.now()
  const del = await call(a.url, `/v1/keys/${key.key_id}`, org.master_key, undefined, 'DELETE')
  const revokedAt = performance.now()
  expect(del.status).toBe(200)
  await Bun.sleep(150)
  stop = true
  await Promise.all(hammers)

  const after = seen.filter((s) => s.startedAt >= revokedAt)
  expect(after.length).toBeGreaterThan(10)
  expect(after.every((s) => s.status === 401)).toBe(true)
  expect(seen.filter((s) => s.startedAt < revokeSent).every((s) => s.status === 200)).toBe(true)
  // Propagation: from sending DELETE to the first refusal seen on each node.
  const delays = ['B', 'C'].map(
    (n) =>
      Math.min(...seen.filter((s) => s.node === n && s.status === 401).map((s) => s.startedAt)) - revokeSent,
  )
  console.log(
    `revocation: DELETE answered in ${(revokedAt - revokeSent).toFixed(1)} ms; first 401 on B ${delays[0]!.toFixed(1)} ms, on C ${delays[1]!.toFixed(1)} ms after it was sent`,
  )
})
