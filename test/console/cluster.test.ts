import { afterAll, beforeAll, expect, test } from 'bun:test'
import { call, startCluster } from '../helpers/cluster.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'

// Console sessions live in the shared store: signed in on one node, the browser is signed in on
// every node, and its logout holds everywhere.
let cluster: Awaited<ReturnType<typeof startCluster>>
beforeAll(async () => {
  cluster = await startCluster(2)
})
afterAll(() => cluster.stop())

test('a session made on node A works on node B, and its logout on B ends it on A', async () => {
  const [a, b] = cluster.nodes as [(typeof cluster.nodes)[0], (typeof cluster.nodes)[0]]
  const org = (await (
    await call(a.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'c-org' })
  ).json()) as {
    id: string
    master_key: string
  }
  const signIn = await fetch(`${a.url}/console/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ token: org.master_key }),
  })
  expect(signIn.status).toBe(201)
  const cookie = signIn.headers.get('set-cookie')!.split(';')[0]!
  const { csrf_token } = (await signIn.json()) as { csrf_token: string }
  const orgOn = (url: string) => fetch(`${url}/console/api/v1/organization`, { headers: { cookie } })
  const onB = await orgOn(b.url)
  expect(onB.status).toBe(200)
  expect(((await onB.json()) as { id: string }).id).toBe(org.id)
  // A key created through B's console is usable on A.
  const created = await fetch(`${b.url}/console/api/v1/keys`, {
    method: 'POST',
    headers: { cookie, 'x-csrf-token': csrf_token, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'from-b' }),
  })
  expect(created.status).toBe(201)
  const secret = ((await created.json()) as { key: string }).key
  expect((await call(a.url, '/v1/models', secret)).status).toBe(200)
  const out = await fetch(`${b.url}/console/session`, {
    method: 'DELETE',
    headers: { cookie, 'x-csrf-token': csrf_token },
  })
  expect(out.status).toBe(200)
  expect((await orgOn(a.url)).status).toBe(401)
  expect((await orgOn(b.url)).status).toBe(401)
})
