import { Database } from 'bun:sqlite'
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI from 'openai'
import { startChatBatch } from '../helpers/batches.ts'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN } from '../helpers/start.ts'
import { startYieldFleet, streamOnce, until, YIELD_BATCHES, YIELD_SEQS } from '../helpers/yield-fleet.ts'

// With server.workers, the primary runs every batch line and the workers every interactive
// request (docs/workers.md). A batch yields to interactive traffic there as in one process: the
// workers tell the primary of their requests on each node (src/workers/nodes.ts), and lines are
// pre-empted as they arrive.
const SEQS = YIELD_SEQS
const WORKERS = 2

describe(`${WORKERS} workers: interactive requests take nodes back from the primary's batch`, () => {
  let fleet: Awaited<ReturnType<typeof startYieldFleet>>
  let router: Awaited<ReturnType<typeof startRouterProcess>>
  let client: OpenAI
  let key: string
  const dir = mkdtempSync(join(tmpdir(), 'tropa-workers-yield-'))

  beforeAll(async () => {
    fleet = await startYieldFleet()
    const configPath = join(dir, 'tropa.json')
    writeFileSync(
      configPath,
      JSON.stringify({
        server: { data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'error', workers: WORKERS },
        batches: YIELD_BATCHES,
        models: [
          {
            id: 'test/chat',
            context_length: 8192,
            pricing: { prompt: '0.000001', completion: '0.000002' },
            routes: fleet.nodes.map((n) => ({
              name: n.name,
              base_url: n.url,
              upstream_model: 'm',
              max_concurrency: SEQS,
              hedge: false,
            })),
          },
        ],
      }),
    )
    router = await startRouterProcess(configPath, freePort(), { TROPA_WORKERS: String(WORKERS) })
    const org = (await jsonCall(router.url, '/v1/admin/organizations', ADMIN_TOKEN, {
      name: 'yield',
      balance_rub: 1000,
    })) as { master_key: string }
    key = ((await jsonCall(router.url, '/v1/keys', org.master_key, { name: 'k' })) as { key: string }).key
    client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: key, maxRetries: 0 })
  })
  afterAll(async () => {
    router?.proc.kill('SIGTERM')
    await router?.proc.exited
    await fleet?.stop()
    rmSync(dir, { recursive: true, force: true })
  })

  const running = () => fleet.running()
  const aborted = () => fleet.aborted()
  /** A streamed request on a connection of its own (so either worker may take it). */
  const stream = (maxTokens: number, content: string) => streamOnce(router.url, key, maxTokens, content)

  test('a request on a node full of lines pre-empts them there, and a load over quiet_load pre-empts them on the other node too; the batch runs on after it, each line billed once', async () => {
    const batch = await startChatBatch(client, 120, { maxTokens: 40, prefix: 'line' })
    // Both nodes full of the primary's lines.
    await until(() => running() === 2 * SEQS)
    const before = aborted()
    // One stream, through whichever worker takes the connection: a load of 1/8, over 0.1.
    const s = await stream(60, 'a stream beside a batch')
    expect(s.status).toBe(200)
    expect(s.text).toContain('data: [DONE]')
    const home = fleet.nodes.findIndex((n) => n.name === s.node)
    expect(home).toBeGreaterThanOrEqual(0)
    // Lines were cancelled upstream on the stream's node (it got a slot at once) and on the other;
    // a node counts a cancel when it notices the closed connection, a moment later on a busy machine.
    const cancelled = () => {
      const after = aborted()
      return after[home]! > before[home]! && after[1 - home]! > before[1 - home]!
    }
    await until(cancelled, 150).catch(async () => {
      // Not seen (a rare CI failure, not reproduced in 25 runs under load here): what the
      // primary did, for the next time.
      const metrics = await (await fetch(`${router.url}/metrics`)).text()
      const fleetView = await (
        await fetch(`${router.url}/v1/admin/fleet`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
      ).text()
      console.error(
        'workers-yield: cancels before / after',
        before,
        aborted(),
        'home',
        home,
        metrics.split('\n').filter((l) => l.startsWith('tropa_batch_')),
        fleetView,
      )
    })
    const after = aborted()
    expect(after[home]! - before[home]!).toBeGreaterThan(0)
    expect(after[1 - home]! - before[1 - home]!).toBeGreaterThan(0)
    // Once the stream is over, the load falls and the batch has both nodes again.
    await until(() => running() === 2 * SEQS)
    await client.batches.cancel(batch.id)
    let b = await client.batches.retrieve(batch.id)
    for (let i = 0; i < 500 && b.status !== 'cancelled'; i++) {
      await Bun.sleep(20)
      b = await client.batches.retrieve(batch.id)
    }
    expect(b.status).toBe('cancelled')
    // Pre-empted runs are not billed: one usage row per completed line, no more (/v1/usage has
    // the primary write what its ledger holds first).
    await fetch(`${router.url}/v1/usage`, { headers: { authorization: `Bearer ${key}` } })
    const db = new Database(join(dir, 'tropa.db'), { readonly: true })
    const rows = db
      .query("SELECT request_id FROM ledger WHERE batch_id = ? AND kind = 'usage'")
      .all(batch.id) as { request_id: string }[]
    db.close()
    expect(b.request_counts!.completed).toBeGreaterThan(0)
    expect(rows).toHaveLength(b.request_counts!.completed)
    expect(new Set(rows.map((r) => r.request_id)).size).toBe(rows.length)
  }, 60_000)

  test('interactive requests from both workers all get a slot at once on a fleet full of lines', async () => {
    const batch = await startChatBatch(client, 120, { maxTokens: 40, prefix: 'again' })
    await until(() => running() === 2 * SEQS)
    const before = aborted().reduce((a, b) => a + b, 0)
    // As many requests as the fleet has slots, each on a connection of its own.
    const answers = await Promise.all(Array.from({ length: 2 * SEQS }, (_, i) => stream(4, `at once ${i}`)))
    for (const a of answers) {
      expect(a.status).toBe(200)
      expect(a.text).toContain('data: [DONE]')
    }
    expect(aborted().reduce((a, b) => a + b, 0) - before).toBeGreaterThanOrEqual(2 * SEQS)
    // Nothing queued inside a node behind a line.
    expect(fleet.nodes.every((n) => n.stats().waiting === 0)).toBe(true)
    await client.batches.cancel(batch.id)
  }, 60_000)
})
