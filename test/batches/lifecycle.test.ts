import { afterEach, describe, expect, test } from 'bun:test'
import { renameSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import OpenAI, { toFile } from 'openai'
import { startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const line = (i: number) => ({
  custom_id: `r${i}`,
  method: 'POST',
  url: '/v1/chat/completions',
  body: { model: 'test/chat', messages: [{ role: 'user', content: `n${i}` }], max_tokens: 20 },
})
const jsonl = (n: number) => `${Array.from({ length: n }, (_, i) => JSON.stringify(line(i))).join('\n')}\n`
/** One slow node with room for few lines at once, so a batch takes a while. */
const slowFleet = () => ({ nodes: [{ name: 'slow', itlMs: 15, prefillTokensPerSec: 100_000 }] })

async function until(client: OpenAI, id: string, statuses: string[], ms = 20_000) {
  const deadline = Date.now() + ms
  for (;;) {
    const b = await client.batches.retrieve(id)
    if (statuses.includes(b.status)) return b
    if (Date.now() > deadline) throw new Error(`batch stuck in ${b.status}`)
    await Bun.sleep(25)
  }
}
/** Uploads `n` chat lines and creates a batch of them (24 h window). */
async function createBatch(client: OpenAI, n: number) {
  const file = await client.files.create({
    file: await toFile(Buffer.from(jsonl(n)), 'b.jsonl'),
    purpose: 'batch',
  })
  return client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
  })
}
const linesOf = async (client: OpenAI, fileId: string | null | undefined) =>
  fileId
    ? (await (await client.files.content(fileId)).text())
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l))
    : []

describe('batch lifecycle', () => {
  /**
   * A running batch of `n` lines whose results cannot be written: once its input is read, a plain
   * file takes the files directory's place (`repair` puts it back). `errors` collects the error
   * log lines.
   */
  async function batchThatCannotFinish(n: number) {
    const errors: string[] = []
    t = await startTropa({
      ...slowFleet(),
      extra: { batches: { tick_ms: 50, workers: 1, concurrency: 4 } },
      log: (level, msg) => {
        if (level === 'error') errors.push(msg)
      },
    })
    const client = t.client()
    const created = await createBatch(client, n)
    await until(client, created.id, ['in_progress'])
    const filesDir = join(t.dir, 'files')
    renameSync(filesDir, `${filesDir}.away`)
    writeFileSync(filesDir, '')
    const repair = () => {
      rmSync(filesDir)
      renameSync(`${filesDir}.away`, filesDir)
    }
    const firstFailure = async () => {
      for (let i = 0; i < 400 && !errors.includes('batch worker'); i++) await Bun.sleep(25)
      expect(errors).toContain('batch worker') // the worker failed to write the result files
    }
    return { client, id: created.id, errors, repair, firstFailure }
  }

  test('a finalization that fails is tried again at the next tick, not after the 30 s claim window', async () => {
    const { client, id, repair, firstFailure } = await batchThatCannotFinish(12)
    try {
      await firstFailure()
    } finally {
      repair()
    }
    const repaired = Date.now()
    const b = await until(client, id, ['completed', 'failed'], 45_000)
    const waited = Date.now() - repaired
    expect(b.status).toBe('completed')
    expect((await linesOf(client, b.output_file_id)).length).toBe(12)
    // Before, the claim of the failed attempt held the batch for FINALIZE_STALE_S (30 s).
    expect(waited).toBeLessThan(5_000)
  }, 60_000)

  test('a finalization that keeps failing is retried once at once, then only after the claim window', async () => {
    const { errors, repair, firstFailure } = await batchThatCannotFinish(4)
    try {
      await firstFailure()
      await Bun.sleep(2_000) // forty ticks
      // The first failure and the one immediate retry; a retry at every tick would be dozens.
      expect(errors.filter((e) => e === 'batch worker')).toHaveLength(2)
    } finally {
      repair()
    }
  }, 60_000)

  test('the key is revoked mid-batch: it fails now (not at expiry), finished lines delivered, the rest key_revoked', async () => {
    t = await startTropa({ ...slowFleet(), extra: { batches: { tick_ms: 50, workers: 1, concurrency: 4 } } })
    const res = await t.fetch('/v1/keys', {
      method: 'POST',
      key: t.masterKey,
      body: JSON.stringify({ name: 'doomed' }),
    })
    const doomed = (await res.json()) as { key_id: string; key: string }
    const client = t.client(doomed.key)
    const created = await createBatch(client, 60)
    const owner = t.client(t.apiKey)
    for (let b = await until(owner, created.id, ['in_progress']); (b.request_counts?.completed ?? 0) < 5; ) {
      await Bun.sleep(20)
      b = await owner.batches.retrieve(created.id)
    }
    const del = await t.fetch(`/v1/keys/${doomed.key_id}`, { method: 'DELETE', key: t.masterKey })
    expect(del.status).toBe(200)
    // Read it with another key of the organization: the revoked one gets 401 now.
    const b = await until(owner, created.id, ['failed'], 10_000)
    expect(b.errors?.data?.[0]?.code).toBe('key_revoked')
    const ok = await linesOf(owner, b.output_file_id)
    const bad = await linesOf(owner, b.error_file_id)
    expect(ok.length).toBeGreaterThanOrEqual(5)
    expect(ok.length + bad.length).toBe(60)
    expect(bad.every((l) => l.error.code === 'key_revoked')).toBe(true)
  })

  test('cancel: cancelling -> cancelled, finished lines delivered, the rest in the error file', async () => {
    t = await startTropa({ ...slowFleet(), extra: { batches: { tick_ms: 50, workers: 1, concurrency: 4 } } })
    const client = t.client()
    const created = await createBatch(client, 60)
    for (let b = await until(client, created.id, ['in_progress']); (b.request_counts?.completed ?? 0) < 5; ) {
      await Bun.sleep(20)
      b = await client.batches.retrieve(created.id)
    }
    const cancelling = await client.batches.cancel(created.id)
    expect(['cancelling', 'cancelled']).toContain(cancelling.status)
    const b = await until(client, created.id, ['cancelled'])
    expect(b.cancelled_at).toBeGreaterThan(0)
    const ok = await linesOf(client, b.output_file_id)
    const bad = await linesOf(client, b.error_file_id)
    expect(ok.length).toBeGreaterThanOrEqual(5)
    expect(ok.length).toBeLessThan(60)
    expect(ok.length + bad.length).toBe(60)
    expect(new Set([...ok, ...bad].map((l) => l.custom_id)).size).toBe(60)
    expect(bad.every((l) => l.error.code === 'batch_cancelled')).toBe(true)
    expect(b.request_counts).toEqual({ total: 60, completed: ok.length, failed: bad.length })
    // cancelling a finished batch again is harmless; a completed one cannot be cancelled
    expect((await client.batches.cancel(created.id)).status).toBe('cancelled')
  }, 30_000)

  test('expiry: unfinished lines go to the error file as batch_expired', async () => {
    t = await startTropa({
      ...slowFleet(),
      extra: { batches: { tick_ms: 50, workers: 1, concurrency: 2, window_sec: 1 } },
    })
    const client = t.client()
    const created = await createBatch(client, 80)
    expect(created.expires_at! - created.created_at).toBe(1)
    const b = await until(client, created.id, ['expired'])
    expect(b.expired_at).toBeGreaterThan(0)
    const ok = await linesOf(client, b.output_file_id)
    const bad = await linesOf(client, b.error_file_id)
    expect(bad.length).toBeGreaterThan(0)
    expect(ok.length + bad.length).toBe(80)
    expect(bad.every((l) => l.error.code === 'batch_expired')).toBe(true)
  }, 30_000)

  test('a completed batch cannot be cancelled: 409', async () => {
    t = await startTropa()
    const client = t.client()
    const created = await createBatch(client, 2)
    await until(client, created.id, ['completed'])
    const err = await client.batches.cancel(created.id).catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.ConflictError)
    expect(err.code).toBe('batch_not_cancellable')
  })
})
