import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { RedisClient } from 'bun'
import OpenAI from 'openai'
import { countChatPrompt, loadTokenizer } from '../../src/pipeline/tokens.ts'
import { startSimFleet } from '../../src/simulator/index.ts'
import { call } from '../helpers/cluster.ts'
import { clusterConfig, startNode } from '../helpers/infra.ts'
import { freshPgDatabase } from '../helpers/pg.ts'
import { freePort, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'

// A key's max_concurrency and an organization's rate limits on two nodes sharing Redis: node A
// is a process of its own (so the last test can kill -9 it), node B runs in this process. Slots
// and counts live in Redis, so the bounds hold whichever node a request hits, and the slots of a
// killed node come back once its lease (1 s here) runs out.
const LEASE_MS = 1000
const REDIS_URL = process.env.TROPA_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'
const dir = mkdtempSync(join(tmpdir(), 'tropa-limits-'))
// One slow node: a stream of n tokens lasts n x 20 ms (every answer runs to max_tokens).
const fleet = await startSimFleet([{ name: 'slow', itlMs: 20, ignoreEos: true, seed: 1 }])
const pg = await freshPgDatabase()
const redis = new RedisClient(REDIS_URL)

let cfg: ReturnType<typeof clusterConfig>
let a: Awaited<ReturnType<typeof startRouterProcess>>
let b: Awaited<ReturnType<typeof startNode>>
let master: string
let orgId: string
beforeAll(async () => {
  cfg = clusterConfig({
    dir,
    pgUrl: pg.url,
    redisUrl: REDIS_URL,
    sim: fleet.nodes,
    redis: { reservation_lease_ms: LEASE_MS },
  })
  a = await startRouterProcess(cfg.path, freePort())
  b = await startNode(cfg.path)
  const org = (await (
    await call(b.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'limits', balance_rub: 1000 })
  ).json()) as { id: string; master_key: string }
  master = org.master_key
  orgId = org.id
})
afterAll(async () => {
  a?.proc.kill('SIGKILL')
  await b?.stop()
  await fleet.stop()
  await pg.drop()
  redis.close()
  rmSync(dir, { recursive: true, force: true })
})

const messages = [{ role: 'user' as const, content: 'Count slowly across nodes.' }]
const client = (url: string, key: string) =>
  new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0, timeout: 20_000 })

async function newKey(body: Record<string, unknown>) {
  const res = await call(b.url, '/v1/keys', master, { name: 'k', ...body })
  expect(res.status).toBe(201)
  const k = (await res.json()) as { key: string; key_id: string }
  // The new key is seen by A (looked up in PostgreSQL on first sight).
  return k
}

async function openStream(c: OpenAI, maxTokens: number) {
  const abort = new AbortController()
  const stream = await c.chat.completions.create(
    { model: 'test/chat', messages, max_tokens: maxTokens, stream: true },
    { signal: abort.signal },
  )
  const it = stream[Symbol.asyncIterator]()
  expect((await it.next()).done).toBe(false)
  return {
    abort: () => abort.abort(),
    async rest() {
      while (!(await it.next()).done) {}
    },
  }
}

const quick = (c: OpenAI) => c.chat.completions.create({ model: 'test/chat', messages, max_tokens: 1 })

/** 200, or the 429's code. */
const outcome = (p: Promise<unknown>) =>
  p.then(
    () => 200 as const,
    (e: unknown) => {
      const err = e as InstanceType<typeof OpenAI.APIError>
      return err.status === 429 ? String(err.code) : `status ${err.status}`
    },
  )

/** Quick requests until one is admitted (an abort or a lease reaches Redis a moment later); how many were refused first. */
async function admittedSoon(c: OpenAI, code: string, tries = 200) {
  for (let i = 0; i < tries; i++) {
    const r = await outcome(quick(c))
    if (r === 200) return i
    expect(r).toBe(code)
    await Bun.sleep(25)
  }
  throw new Error('never admitted')
}

/** Not within two seconds of a minute's end, so one test's requests fall in one window. */
async function awayFromMinuteEnd() {
  const into = Date.now() % 60_000
  if (into > 58_000) await Bun.sleep(60_000 - into + 50)
}

test('max_concurrency = 2 is one count for both nodes: a stream on each fills it, a third on either gets 429; ends and aborts free the slots', async () => {
  const k = await newKey({ max_concurrency: 2 })
  const ca = client(a.url, k.key)
  const cb = client(b.url, k.key)
  const onA = await openStream(ca, 40)
  const onB = await openStream(cb, 3000)
  expect(await outcome(quick(ca))).toBe('key_concurrency_exceeded')
  expect(await outcome(quick(cb))).toBe('key_concurrency_exceeded')
  const refusedAll = await Promise.all(Array.from({ length: 8 }, (_, i) => outcome(quick(i % 2 ? ca : cb))))
  expect(refusedAll.every((r) => r === 'key_concurrency_exceeded')).toBe(true)

  // A's stream ends: B admits one (A released its slot in Redis before the stream's end was sent).
  await onA.rest()
  expect(await outcome(quick(cb))).toBe(200)
  // Two long streams in flight again, one per node; B's client leaves: A admits once B notices.
  const second = await openStream(ca, 3000)
  expect(await outcome(quick(ca))).toBe('key_concurrency_exceeded')
  onB.abort()
  await admittedSoon(ca, 'key_concurrency_exceeded')
  second.abort()
  await admittedSoon(cb, 'key_concurrency_exceeded')
  // Nothing is left in flight: both slots are free at once.
  const x = await openStream(ca, 3000)
  const y = await openStream(cb, 3000)
  x.abort()
  y.abort()
  await admittedSoon(ca, 'key_concurrency_exceeded')
  for (let i = 0; i < 100 && (await redis.scard(`${cfg.prefix}cc:${k.key_id}`)) > 0; i++) await Bun.sleep(20)
  expect(await redis.scard(`${cfg.prefix}cc:${k.key_id}`)).toBe(0)
})

test("an organization's rpm_limit over two nodes: exactly the limit is admitted, the rest get 429 org_rate_limited and never reach the upstream", async () => {
  const patched = await call(
    b.url,
    `/v1/admin/organizations/${orgId}`,
    ADMIN_TOKEN,
    { rpm_limit: 12 },
    'PATCH',
  )
  expect(((await patched.json()) as { rpm_limit: number }).rpm_limit).toBe(12)
  // A hears of it on the bus: its own view of the organization shows the limit.
  for (let i = 0; i < 100; i++) {
    const seen = (await (await call(a.url, `/v1/admin/organizations/${orgId}`, ADMIN_TOKEN)).json()) as {
      rpm_limit: number | null
    }
    if (seen.rpm_limit === 12) break
    await Bun.sleep(20)
  }
  const keys = await Promise.all([newKey({}), newKey({})])
  await awayFromMinuteEnd()
  const before = fleet.nodes[0]!.stats().chatRequests
  const res = await Promise.all(
    Array.from({ length: 30 }, (_, i) =>
      outcome(quick(client(i % 2 ? a.url : b.url, keys[Math.floor(i / 2) % 2]!.key))),
    ),
  )
  expect(res.filter((r) => r === 200)).toHaveLength(12)
  expect(res.filter((r) => r === 'org_rate_limited')).toHaveLength(18)
  expect(fleet.nodes[0]!.stats().chatRequests - before).toBe(12)
  await call(b.url, `/v1/admin/organizations/${orgId}`, ADMIN_TOKEN, { rpm_limit: null }, 'PATCH')
})

test('per-model limits over two nodes, set on A: one count per model across the cluster', async () => {
  const org = (await (
    await call(a.url, '/v1/admin/organizations', ADMIN_TOKEN, {
      name: 'per-model',
      balance_rub: 1000,
      model_limits: { 'test/chat': { rpm: 7 }, 'test/*': { rpm: 3 } },
    })
  ).json()) as { id: string; master_key: string }
  const k = (await (await call(a.url, '/v1/keys', org.master_key, { name: 'm' })).json()) as { key: string }
  await awayFromMinuteEnd()
  const chats = await Promise.all(
    Array.from({ length: 16 }, (_, i) => outcome(quick(client(i % 2 ? a.url : b.url, k.key)))),
  )
  expect(chats.filter((r) => r === 200)).toHaveLength(7)
  expect(chats.filter((r) => r === 'model_rate_limited')).toHaveLength(9)
  const embeds = await Promise.all(
    Array.from({ length: 8 }, (_, i) =>
      outcome(client(i % 2 ? a.url : b.url, k.key).embeddings.create({ model: 'test/embed', input: 'v' })),
    ),
  )
  expect(embeds.filter((r) => r === 200)).toHaveLength(3)
  expect(embeds.filter((r) => r === 'model_rate_limited')).toHaveLength(5)
})

test("an organization's tpm_limit over two nodes: the prompt tokens admitted stay within it", async () => {
  await loadTokenizer()
  const prompt = countChatPrompt(messages, undefined)
  const org = (await (
    await call(b.url, '/v1/admin/organizations', ADMIN_TOKEN, {
      name: 'tokens',
      balance_rub: 1000,
      tpm_limit: prompt * 6 + 1,
    })
  ).json()) as { id: string; master_key: string }
  const k = (await (await call(b.url, '/v1/keys', org.master_key, { name: 't' })).json()) as { key: string }
  await awayFromMinuteEnd()
  const res = await Promise.all(
    Array.from({ length: 20 }, (_, i) => outcome(quick(client(i % 2 ? a.url : b.url, k.key)))),
  )
  const ok = res.filter((r) => r === 200).length
  // Completion tokens count too (after each answer), so fewer than six may fit; never more.
  expect(ok).toBeGreaterThanOrEqual(1)
  expect(ok).toBeLessThanOrEqual(6)
  expect(res.filter((r) => r === 'org_rate_limited')).toHaveLength(20 - ok)
})

test('Redis loses the slots of a node that is alive: its heartbeat lists them again, so the bound still holds', async () => {
  const k = await newKey({ max_concurrency: 1 })
  const cb = client(b.url, k.key)
  const held = await openStream(cb, 3000)
  const set = `${cfg.prefix}cc:${k.key_id}`
  const [member] = (await redis.smembers(set)) as string[]
  const node = member!.split('/')[0]!
  // As if Redis restarted empty: the slot and B's heartbeat are gone.
  await redis.del(set)
  await redis.del(`${cfg.prefix}cc-alive:${node}`)
  for (let i = 0; i < 200 && (await redis.scard(set)) === 0; i++) await Bun.sleep(10)
  expect(await redis.smembers(set)).toEqual([member!])
  expect(await outcome(quick(client(a.url, k.key)))).toBe('key_concurrency_exceeded')
  held.abort()
  await admittedSoon(cb, 'key_concurrency_exceeded')
})

test('a node killed (kill -9) while holding slots: B refuses until its lease runs out, then admits; nothing of A is left', async () => {
  const k = await newKey({ max_concurrency: 2 })
  const ca = client(a.url, k.key)
  const cb = client(b.url, k.key)
  const held = [await openStream(ca, 3000), await openStream(ca, 3000)]
  expect(await outcome(quick(cb))).toBe('key_concurrency_exceeded')
  const set = `${cfg.prefix}cc:${k.key_id}`
  expect(await redis.scard(set)).toBe(2)
  const killedAt = performance.now()
  a.proc.kill('SIGKILL')
  await a.proc.exited
  for (const s of held) s.abort()
  // Refused while A's lease lasts (a dead node's slots still count until then), then admitted.
  const refusedFirst = await admittedSoon(cb, 'key_concurrency_exceeded', 400)
  const after = performance.now() - killedAt
  expect(refusedFirst).toBeGreaterThan(0)
  expect(after).toBeLessThan(LEASE_MS * 4 + 2000)
  // Both of A's slots are gone: two streams fit on B now, and only B's are listed.
  const x = await openStream(cb, 3000)
  const y = await openStream(cb, 3000)
  const members = (await redis.smembers(set)) as string[]
  expect(members).toHaveLength(2)
  expect(new Set(members.map((m) => m.split('/')[0])).size).toBe(1)
  x.abort()
  y.abort()
  console.log(
    `concurrency: a killed node's slots came back ${after.toFixed(0)} ms after kill -9 (lease ${LEASE_MS} ms)`,
  )
}, 30_000)
