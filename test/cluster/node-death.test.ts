import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { RedisClient } from 'bun'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import type { SharedMeter } from '../../src/billing/shared-meter.ts'
import { countChatPrompt, loadTokenizer, reservedPromptTokens } from '../../src/pipeline/tokens.ts'
import { startSimFleet } from '../../src/simulator/index.ts'
import { call } from '../helpers/cluster.ts'
import { clusterConfig, startNode } from '../helpers/infra.ts'
import { freshPgDatabase } from '../helpers/pg.ts'
import { freePort, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN, CHAT_PRICE } from '../helpers/start.ts'

// A node killed (SIGKILL) while a long stream holds most of a key's limit: the other nodes give
// its hold back once its heartbeat lease runs out, and a request needing that room is admitted.
const LEASE_MS = 1000
const REDIS_URL = process.env.TROPA_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'
const dir = mkdtempSync(join(tmpdir(), 'tropa-node-death-'))
const fleet = await startSimFleet([{ name: 'slow', itlMs: 40, seed: 1 }])
const pg = await freshPgDatabase()
const redis = new RedisClient(REDIS_URL)
afterAll(async () => {
  await fleet.stop()
  await pg.drop()
  redis.close()
  rmSync(dir, { recursive: true, force: true })
})

let cfg: ReturnType<typeof clusterConfig>
beforeAll(() => {
  cfg = clusterConfig({
    dir,
    pgUrl: pg.url,
    redisUrl: REDIS_URL,
    sim: fleet.nodes,
    redis: { reservation_lease_ms: LEASE_MS },
  })
})

const messages = [{ role: 'user' as const, content: 'Tell me a long story.' }]
const MAX = 400

test('a node killed mid-stream: its hold comes back within the lease, another node admits the request that needed it', async () => {
  await loadTokenizer()
  const price = {
    promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
    completionNano: parseRub(CHAT_PRICE.completion, 6)!,
  }
  const worst = costNano(reservedPromptTokens(countChatPrompt(messages, undefined)), MAX, price)
  const limitNano = (worst * 3n) / 2n

  const a = await startRouterProcess(cfg.path, freePort())
  const b = await startNode(cfg.path)
  try {
    const org = (await (
      await call(b.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'death', balance_rub: 100 })
    ).json()) as { id: string; master_key: string }
    const key = (await (
      await call(b.url, '/v1/keys', org.master_key, { name: 'k', limit_rub: nanoToRubNumber(limitNano) })
    ).json()) as { key: string; key_id: string }
    const body = { model: 'test/chat', messages, max_tokens: MAX, stream: true }

    // A holds the worst case of a long stream (400 tokens at 40 ms each: 16 s).
    const held = await call(a.url, '/v1/chat/completions', key.key, body)
    expect(held.status).toBe(200)
    const reader = held.body!.getReader()
    await reader.read()

    // B cannot fit a second one.
    const probe = async () => {
      const res = await call(b.url, '/v1/chat/completions', key.key, body)
      await res.body?.cancel().catch(() => {})
      return res.status
    }
    expect(await probe()).toBe(402)

    // What is left of A's heartbeat lease just before the kill. A renews it every LEASE_MS / 4
    // when its event loop gets to it, so on a busy machine it may have less than LEASE_MS - 250 left.
    const meter = b.svc.deps.meter as SharedMeter
    const aId = (await redis.smembers(`${cfg.prefix}nodes`)).find((id) => id !== meter.nodeId)!
    const askedAt = performance.now()
    const leaseLeftMs = Number(await redis.send('PTTL', [`${cfg.prefix}alive:${aId}`]))
    expect(leaseLeftMs).toBeGreaterThan(0)
    const killedAt = performance.now()
    a.proc.kill('SIGKILL')
    await a.proc.exited
    reader.cancel().catch(() => {})
    let status = 402
    let admittedAfter = 0
    while (performance.now() - killedAt < LEASE_MS * 4) {
      status = await probe()
      if (status === 200) {
        admittedAfter = performance.now() - killedAt
        break
      }
      expect(status).toBe(402)
      await Bun.sleep(25)
    }
    expect(status).toBe(200)
    // Not before A's lease ran out (it had at least leaseLeftMs left when asked, askedAt), and
    // within a sweep (every LEASE_MS / 4) of a full lease.
    expect(admittedAfter).toBeGreaterThanOrEqual(leaseLeftMs - (killedAt - askedAt))
    expect(admittedAfter).toBeLessThan(LEASE_MS * 1.25 + 500)

    // Nothing of A is left in Redis, and the key's room is exactly its limit minus its recorded spend.
    await Bun.sleep(100)
    await b.svc.ledger.flush()
    expect(await redis.smembers(`${cfg.prefix}nodes`)).toEqual([meter.nodeId])
    const rec = (await b.svc.store.getKey(key.key_id))!
    expect(rec.spentNano).toBeLessThanOrEqual(limitNano)
    expect(BigInt((await redis.get(`${cfg.prefix}room:key:${key.key_id}`))!)).toBe(limitNano - rec.spentNano)
    console.log(
      `node death: hold of ${nanoToRubNumber(worst)} RUB given back ${admittedAfter.toFixed(0)} ms after kill -9 (lease ${LEASE_MS} ms, ${leaseLeftMs} ms of it left at the kill)`,
    )
  } finally {
    a.proc.kill('SIGKILL')
    await b.stop()
  }
}, 20_000)
