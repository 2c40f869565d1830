import { afterAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import { countChatPrompt, loadTokenizer, reservedPromptTokens } from '../../src/pipeline/tokens.ts'
import { startSimFleet } from '../../src/simulator/index.ts'
import { call } from '../helpers/cluster.ts'
import { clusterConfig, startNode, startRedisServer } from '../helpers/infra.ts'
import { freshPgDatabase } from '../helpers/pg.ts'
import { ADMIN_TOKEN, CHAT_PRICE } from '../helpers/start.ts'

// Redis (a server of this file's own, no persistence) killed under load and started again
// empty, while a key is revoked: no key goes over its limit, the revoked key is not served past
// the bound, and every node serves again without a restart.
const BOUND_MS = 500
const dir = mkdtempSync(join(tmpdir(), 'tropa-redis-outage-'))
const fleet = await startSimFleet(
  [1, 2].map((i) => ({ name: `sim-${i}`, itlMs: 4, iterationOverheadMs: 1, seed: i })),
)
const redis = await startRedisServer()
const pg = await freshPgDatabase()
afterAll(async () => {
  await redis.stop()
  await fleet.stop()
  await pg.drop()
  rmSync(dir, { recursive: true, force: true })
})

const messages = [{ role: 'user' as const, content: 'Count to twenty, please.' }]
const MAX = 20

test('Redis killed and restarted empty under load: no overspend, revoked key refused within the bound, service recovers', async () => {
  await loadTokenizer()
  const cfg = clusterConfig({
    dir,
    pgUrl: pg.url,
    redisUrl: redis.url,
    sim: fleet.nodes,
    redis: { revocation_bound_ms: BOUND_MS, reservation_lease_ms: 1000 },
  })
  const nodes = [await startNode(cfg.path), await startNode(cfg.path), await startNode(cfg.path)]
  try {
    const price = {
      promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
      completionNano: parseRub(CHAT_PRICE.completion, 6)!,
    }
    const worst = costNano(reservedPromptTokens(countChatPrompt(messages, undefined)), MAX, price)
    const limitNano = worst * 60n
    const org = (await (
      await call(nodes[0]!.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'r', balance_rub: 100 })
    ).json()) as { id: string; master_key: string }
    const mk = async (body: Record<string, unknown>) =>
      (await (await call(nodes[1]!.url, '/v1/keys', org.master_key, body)).json()) as {
        key: string
        key_id: string
      }
    const tight = await mk({ name: 'tight', limit_rub: nanoToRubNumber(limitNano) })
    const doomed = await mk({ name: 'doomed' })
    const spare = await mk({ name: 'spare' })
    await Bun.sleep(50)

    type Seen = { key: string; node: number; start: number; end: number; status: number; id: string }
    const seen: Seen[] = []
    let stop = false
    const t0 = performance.now()
    const load = async (key: { key: string; key_id: string }, node: number, i: number) => {
      let n = 0
      while (!stop) {
        const start = performance.now() - t0
        const stream = (n++ + i) % 2 === 1
        const res = await call(nodes[node]!.url, '/v1/chat/completions', key.key, {
          model: 'test/chat',
          messages,
          max_tokens: MAX,
          stream,
        }).catch(() => undefined)
        await res?.arrayBuffer().catch(() => {})
        const status = res?.status ?? 0
        seen.push({
          key: key.key_id,
          node,
          start,
          end: performance.now() - t0,
          status,
          id: res?.headers.get('x-request-id') ?? '',
        })
        if (status !== 200) await Bun.sleep(10)
      }
    }
    const workers = [
      ...[0, 1, 2, 0, 1, 2].map((n, i) => load(tight, n, i)),
      ...[0, 1, 2].map((n, i) => load(doomed, n, i)),
    ]
    await Bun.sleep(300)
    const killedAt = performance.now() - t0
    await redis.kill()
    await Bun.sleep(700)
    // Revoked through node 0 while Redis is away: the event cannot be delivered.
    const revokeSent = performance.now() - t0
    const del = await call(nodes[0]!.url, `/v1/keys/${doomed.key_id}`, org.master_key, undefined, 'DELETE')
    const revokedAt = performance.now() - t0
    expect(del.status).toBe(200)
    await Bun.sleep(300)
    const restartedAt = performance.now() - t0
    await redis.start()
    // Back: every node serves a key with room again, without a restart.
    const recovered: number[] = []
    for (const [i, n] of nodes.entries()) {
      for (let a = 0; a < 200; a++) {
        const res = await call(n.url, '/v1/chat/completions', spare.key, {
          model: 'test/chat',
          messages,
          max_tokens: 2,
        })
        await res.arrayBuffer()
        if (res.status === 200) {
          recovered[i] = performance.now() - t0 - restartedAt
          break
        }
        await Bun.sleep(25)
      }
    }
    await Bun.sleep(1500)
    stop = true
    await Promise.all(workers)
    await Bun.sleep(100)
    for (const n of nodes) await n.svc.ledger.flush()

    expect(recovered.filter((x) => x !== undefined)).toHaveLength(3)
    // The revoked key: never served once the bound has passed since DELETE was answered.
    const doomedAfter = seen.filter((s) => s.key === doomed.key_id && s.start > revokedAt + BOUND_MS)
    expect(doomedAfter.length).toBeGreaterThan(10)
    expect(doomedAfter.every((s) => s.status === 401)).toBe(true)
    // While Redis was away, money could not be checked: nothing was admitted.
    const whileDown = seen.filter((s) => s.start > killedAt + 50 && s.end < restartedAt)
    expect(whileDown.filter((s) => s.status === 200)).toHaveLength(0)

    // The tight key: never over its limit, and it was used up after the restart (the rebuilt
    // room was what decided); ledger = spent = balance drop.
    const store = nodes[0]!.svc.store
    const rec = (await store.getKey(tight.key_id))!
    const tightOk = seen.filter((s) => s.key === tight.key_id && s.status === 200)
    const tightAfter = seen.filter((s) => s.key === tight.key_id && s.start > restartedAt)
    expect(tightAfter.some((s) => s.status === 200)).toBe(true)
    expect(tightAfter.some((s) => s.status === 402)).toBe(true)
    expect(rec.spentNano).toBeLessThanOrEqual(limitNano)
    const rows = (await store.ledgerForOrg(org.id, 0, Date.now() + 1000)).filter((r) => r.kind === 'usage')
    const tightRows = rows.filter((r) => r.keyId === tight.key_id)
    expect(tightRows.map((r) => r.requestId).sort()).toEqual(tightOk.map((s) => s.id).sort())
    const sum = (rs: typeof rows) => rs.reduce((s, r) => s + r.costNano, 0n)
    expect(rec.spentNano).toBe(sum(tightRows))
    const balance = (await store.getOrg(org.id))!.balanceNano
    expect(100_000_000_000n - balance).toBe(sum(rows))
    // The rooms rebuilt after the data loss are exact once nothing is in flight.
    expect(BigInt(redis.cli('GET', `${cfg.prefix}room:key:${tight.key_id}`))).toBe(limitNano - rec.spentNano)
    expect(BigInt(redis.cli('GET', `${cfg.prefix}room:org:${org.id}`))).toBe(balance)
    // The bus hears again: a key revoked now is refused by the other nodes from the response on.
    await Bun.sleep(BOUND_MS)
    expect(
      (await call(nodes[0]!.url, `/v1/keys/${spare.key_id}`, org.master_key, undefined, 'DELETE')).status,
    ).toBe(200)
    for (const n of nodes.slice(1))
      expect(
        (
          await call(n.url, '/v1/chat/completions', spare.key, {
            model: 'test/chat',
            messages,
            max_tokens: 2,
          })
        ).status,
      ).toBe(401)
    const firstRefusal = Math.min(
      ...[1, 2].map((n) =>
        Math.min(
          ...seen
            .filter((s) => s.key === doomed.key_id && s.node === n && s.status === 401)
            .map((s) => s.start),
        ),
      ),
    )
    console.log(
      `redis restart: tight key ${tightOk.length} admitted, spent ${nanoToRubNumber(rec.spentNano)} of ${nanoToRubNumber(limitNano)} RUB; ` +
        `revocation while Redis was down answered in ${(revokedAt - revokeSent).toFixed(0)} ms, other nodes refused it from ${(firstRefusal - revokeSent).toFixed(0)} ms; ` +
        `nodes served again ${recovered.map((x) => x.toFixed(0)).join('/')} ms after Redis restarted`,
    )
  } finally {
    for (const n of nodes) await n.stop()
  }
}, 20_000)
