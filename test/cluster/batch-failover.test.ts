import { afterAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { SQL } from 'bun'
import OpenAI from 'openai'
import { startSimFleet } from '../../src/simulator/index.ts'
import { startChatBatch, waitForCompleted } from '../helpers/batches.ts'
import { clusterConfig, startNode } from '../helpers/infra.ts'
import { freshPgDatabase } from '../helpers/pg.ts'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'

// Three nodes share one batch queue; the node the batch was made on (a separate process) is
// kill -9'd halfway. Its leased lines come back when their lease runs out and the other two
// nodes finish the batch: every line's output exactly once, and one ledger row per line.
const LEASE_MS = 1500
const REDIS_URL = process.env.TROPA_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'
const dir = mkdtempSync(join(tmpdir(), 'tropa-batch-failover-'))
const fleet = await startSimFleet(
  [1, 2].map((i) => ({ name: `sim-${i}`, itlMs: 4, prefillTokensPerSec: 100_000, seed: i })),
)
const pg = await freshPgDatabase()
afterAll(async () => {
  await fleet.stop()
  await pg.drop()
  rmSync(dir, { recursive: true, force: true })
})

test('three nodes, the batch node killed halfway: the others finish it, each line once', async () => {
  const cfg = clusterConfig({
    dir,
    pgUrl: pg.url,
    redisUrl: REDIS_URL,
    sim: fleet.nodes,
    redis: { reservation_lease_ms: 1000 },
    extra: { batches: { tick_ms: 50, workers: 1, concurrency: 8, lease_ms: LEASE_MS } },
  })
  const a = await startRouterProcess(cfg.path, freePort())
  const others = [await startNode(cfg.path), await startNode(cfg.path)]
  try {
    const org = await jsonCall(a.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'b', balance_rub: 100 })
    const key = await jsonCall(a.url, '/v1/keys', org.master_key as string, { name: 'k' })
    const N = 300
    const ca = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: key.key as string, maxRetries: 0 })
    const created = await startChatBatch(ca, N)
    const seen = await waitForCompleted(ca, created.id, N / 2, 500)
    expect(seen).toBeGreaterThan(0)
    const killedAt = performance.now()
    a.proc.kill('SIGKILL')
    await a.proc.exited

    const cb = new OpenAI({ baseURL: `${others[0]!.url}/v1`, apiKey: key.key as string, maxRetries: 0 })
    let b = await cb.batches.retrieve(created.id)
    for (let i = 0; i < 300 && b.status !== 'completed'; i++) {
      await Bun.sleep(50)
      b = await cb.batches.retrieve(created.id)
    }
    const doneAfter = performance.now() - killedAt
    expect(b.status).toBe('completed')
    expect(b.request_counts?.completed).toBe(N)
    const out = (await (await cb.files.content(b.output_file_id!)).text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { custom_id: string; response: { request_id: string } })
    expect(out).toHaveLength(N)
    expect(out.map((o) => o.custom_id).sort()).toEqual(Array.from({ length: N }, (_, i) => `id-${i}`).sort())

    for (const n of others) await n.svc.ledger.flush()
    const db = new SQL(pg.url)
    const billed = (await db`
      SELECT request_id, count(*)::int AS n FROM ledger WHERE batch_id = ${created.id} GROUP BY request_id`) as {
      request_id: string
      n: number
    }[]
    const retaken = (await db`
      SELECT count(*)::int AS n FROM batch_lines WHERE batch_id = ${created.id} AND attempts > 1`) as {
      n: number
    }[]
    const spent = (
      (await db`SELECT spent_nano::text AS v FROM keys WHERE id = ${key.key_id as string}`) as {
        v: string
      }[]
    )[0]!.v
    const sum = (
      (await db`
      SELECT coalesce(sum(cost_nano), 0)::text AS v FROM ledger WHERE batch_id = ${created.id}`) as {
        v: string
      }[]
    )[0]!.v
    const outputs = (await db`
      SELECT count(*)::int AS n FROM files WHERE filename = ${`${created.id}_output.jsonl`}`) as {
      n: number
    }[]
    await db.close()
    // The two surviving nodes both saw the batch end; one of them finalized it.
    expect(outputs[0]!.n).toBe(1)
    // One ledger row per line: the row is written with the line's result, in one transaction.
    expect(billed.every((r) => r.n === 1)).toBe(true)
    expect(billed.map((r) => r.request_id).sort()).toEqual(out.map((o) => o.response.request_id).sort())
    expect(BigInt(spent)).toBe(BigInt(sum))
    // Lines the killed node held were taken over once their lease ran out.
    expect(retaken[0]!.n).toBeGreaterThan(0)
    console.log(
      `batch failover: node killed at ${seen}/${N}; ${retaken[0]!.n} leased lines taken over, batch completed ${doneAfter.toFixed(0)} ms after the kill (lease ${LEASE_MS} ms); ${billed.length}/${N} lines billed once`,
    )
  } finally {
    a.proc.kill('SIGKILL')
    for (const n of others) await n.stop()
  }
}, 30_000)
