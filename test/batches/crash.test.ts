import { Database } from 'bun:sqlite'
import { afterAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI from 'openai'
import { startSimFleet } from '../../src/simulator/index.ts'
import { startChatBatch, waitForCompleted } from '../helpers/batches.ts'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN, defaultModels } from '../helpers/start.ts'

// kill -9 the router in the middle of a batch, restart it: the batch resumes, every line
// appears exactly once across the output and error files, and nothing is billed twice.
const dir = mkdtempSync(join(tmpdir(), 'tropa-batch-crash-'))
const fleet = await startSimFleet(
  [1, 2].map((i) => ({ name: `sim-${i}`, itlMs: 4, prefillTokensPerSec: 100_000, seed: i })),
)
afterAll(async () => {
  await fleet.stop()
  rmSync(dir, { recursive: true, force: true })
})
const configPath = join(dir, 'tropa.json')
writeFileSync(
  configPath,
  JSON.stringify({
    server: { data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'error' },
    batches: { tick_ms: 50, workers: 2, concurrency: 8 },
    models: defaultModels(fleet.nodes),
  }),
)

test('kill -9 mid-batch, restart: exactly-once results, no double billing', async () => {
  const port = freePort()
  const first = await startRouterProcess(configPath, port)
  const org = await jsonCall(first.url, '/v1/admin/organizations', ADMIN_TOKEN, {
    name: 'b',
    balance_rub: 100,
  })
  const key = await jsonCall(first.url, '/v1/keys', org.master_key as string, { name: 'k' })
  const N = 400
  const c1 = new OpenAI({ baseURL: `${first.url}/v1`, apiKey: key.key as string, maxRetries: 0 })
  const created = await startChatBatch(c1, N)
  const seen = await waitForCompleted(c1, created.id, N / 4, 400)
  expect(seen).toBeGreaterThan(0)
  first.proc.kill('SIGKILL')
  await first.proc.exited

  const second = await startRouterProcess(configPath, freePort())
  try {
    const c2 = new OpenAI({ baseURL: `${second.url}/v1`, apiKey: key.key as string, maxRetries: 0 })
    let b = await c2.batches.retrieve(created.id)
    for (let i = 0; i < 600 && b.status !== 'completed'; i++) {
      await Bun.sleep(50)
      b = await c2.batches.retrieve(created.id)
    }
    expect(b.status).toBe('completed')
    expect(b.request_counts?.completed).toBe(N)
    const out = (await (await c2.files.content(b.output_file_id!)).text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
    const errs = b.error_file_id
      ? (await (await c2.files.content(b.error_file_id)).text()).trim().split('\n')
      : []
    expect(out.length + errs.length).toBe(N)
    expect(new Set(out.map((o) => o.custom_id)).size).toBe(out.length)
    expect(out.map((o) => o.custom_id).sort()).toEqual(Array.from({ length: N }, (_, i) => `id-${i}`).sort())
  } finally {
    second.proc.kill('SIGTERM')
    await second.proc.exited
  }
  // Each line billed at most once (a line finished in the last flush window before the kill may be unbilled).
  const db = new Database(join(dir, 'tropa.db'), { readonly: true })
  const rowsBilled = db
    .query('SELECT request_id, count(*) AS n FROM ledger WHERE batch_id = ? GROUP BY request_id')
    .all(created.id) as { n: number }[]
  db.close()
  expect(rowsBilled.every((r) => Number(r.n) === 1)).toBe(true)
  expect(rowsBilled.length).toBeLessThanOrEqual(N)
  expect(rowsBilled.length).toBeGreaterThan(N - 50)
}, 60_000)
