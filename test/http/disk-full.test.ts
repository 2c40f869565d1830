// A real full disk: the data directory on a small tmpfs, filled by uploads and by a filler file.
// Mounting needs root (CAP_SYS_ADMIN); elsewhere these tests are skipped, and test/http/files.test.ts
// covers uploads with ENOSPC injected through the file store's test hook.
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, readdirSync, rmSync, statfsSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { loadTokenizer } from '../../src/pipeline/tokens.ts'
import { startChatBatch } from '../helpers/batches.ts'
import { ADMIN_TOKEN, startTropa, type Tropa } from '../helpers/start.ts'

const mnt = mkdtempSync(join(tmpdir(), 'tropa-tmpfs-'))
const mounted =
  process.platform === 'linux' &&
  Bun.spawnSync(['mount', '-t', 'tmpfs', '-o', 'size=12m', 'tmpfs', mnt], { stderr: 'ignore' }).exitCode === 0
if (!mounted) rmSync(mnt, { recursive: true, force: true })

const free = () => {
  const s = statfsSync(mnt)
  return s.bavail * s.bsize
}
const filler = join(mnt, 'filler')
/** Takes every free byte of the tmpfs. */
const fill = () => {
  try {
    writeFileSync(filler, Buffer.alloc(free(), 1))
  } catch {}
}

async function until(f: () => boolean | Promise<boolean>, tries = 1000) {
  for (let i = 0; i < tries && !(await f()); i++) await Bun.sleep(20)
}

describe.skipIf(!mounted)('a full disk (data directory on a 12 MiB tmpfs)', () => {
  let t: Tropa
  beforeAll(async () => {
    await loadTokenizer() // /ready waits for it
    t = await startTropa({
      // Slow lines (16 tokens at 150 ms): the disk fills while they run.
      nodes: [{ name: 'slow', timeScale: 1, itlMs: 150, seed: 1 }],
      extra: {
        server: { port: 0, data_dir: join(mnt, 'data'), admin_token: ADMIN_TOKEN, log_level: 'error' },
        storage: { flush_interval_ms: 10, ledger_queue_max: 20 },
        // A lease far longer than the test: lines must come back without it running out.
        batches: { tick_ms: 50, workers: 1, lease_ms: 600_000 },
      },
    })
  })
  afterAll(async () => {
    await t?.stop()
    if (mounted) {
      Bun.spawnSync(['umount', '-l', mnt]) // lazily: a thread may still hold the database open
      rmSync(mnt, { recursive: true, force: true })
    }
  })
  const ready = async () => ((await (await t.fetch('/ready')).json()) as { status: string }).status
  const jsonError = async (res: Response) => ((await res.json()) as { error: { code: string } }).error.code

  test('batch lines whose results cannot be written run again once space is back', async () => {
    const c = t.client()
    const b = await startChatBatch(c, 6)
    await until(async () => (await c.batches.retrieve(b.id)).status === 'in_progress')
    await until(() => t.nodes[0]!.stats().running > 0)
    fill()
    // The lines finish upstream, and writing their results fails.
    await until(async () => (await ready()) === 'insufficient_storage')
    expect(await ready()).toBe('insufficient_storage')
    expect((await t.fetch('/health')).status).toBe(200)
    rmSync(filler)
    await until(async () => (await c.batches.retrieve(b.id)).status === 'completed')
    const done = await c.batches.retrieve(b.id)
    expect(done.status).toBe('completed')
    expect(done.request_counts?.completed).toBe(6)
    const out = await (await c.files.content(done.output_file_id!)).text()
    expect(out.trim().split('\n')).toHaveLength(6)
  }, 60_000)

  test('uploads, keys and billing get 507 with the OpenAI body; all resumes once space is freed', async () => {
    await until(async () => (await ready()) === 'ready')
    const before = readdirSync(join(mnt, 'data', 'files'))
    const content = (i: number) => `${JSON.stringify({ custom_id: `u-${i}`, pad: 'x'.repeat(1 << 20) })}\n`
    const stored: { id: string; i: number }[] = []
    const statuses: number[] = []
    for (let i = 0; i < 16; i++) {
      const form = new FormData()
      form.set('purpose', 'batch')
      form.set('file', new Blob([content(i)]), `u-${i}.jsonl`)
      const res = await t.fetch('/v1/files', { method: 'POST', body: form })
      statuses.push(res.status)
      if (res.status === 200) stored.push({ id: ((await res.json()) as { id: string }).id, i })
      else expect(await jsonError(res)).toBe('insufficient_storage')
    }
    expect(stored.length).toBeGreaterThan(0)
    expect(statuses.at(-1)).toBe(507)
    expect(statuses.every((s) => s === 200 || s === 507)).toBe(true)
    // Failed uploads left nothing: only the stored files are in the directory.
    expect(readdirSync(join(mnt, 'data', 'files')).sort()).toEqual(
      [...before, ...stored.map((s) => s.id)].sort(),
    )
    fill()
    const key = await t.fetch('/v1/keys', {
      method: 'POST',
      key: t.masterKey,
      body: JSON.stringify({ name: 'k' }),
    })
    expect(key.status).toBe(507)
    expect(await jsonError(key)).toBe('insufficient_storage')
    // Chats are served while the ledger keeps their rows; past ledger_queue_max billing refuses with 507.
    let served = 0
    let refused = 0
    for (let i = 0; i < 40; i++) {
      const res = await t.fetch('/v1/chat/completions', {
        method: 'POST',
        body: JSON.stringify({
          model: 'test/chat',
          messages: [{ role: 'user', content: 'hi' }],
          max_tokens: 1,
        }),
      })
      if (res.status === 200) served++
      else {
        expect(res.status).toBe(507)
        expect(await jsonError(res)).toBe('insufficient_storage')
        refused++
      }
      await res.arrayBuffer().catch(() => {})
    }
    expect(served).toBeGreaterThan(0)
    expect(refused).toBeGreaterThan(0)
    expect(await ready()).toBe('insufficient_storage')
    expect((await t.fetch('/health')).status).toBe(200)

    rmSync(filler)
    await until(async () => (await ready()) === 'ready' && t.svc.ledger.backlog === 0)
    expect(await ready()).toBe('ready')
    expect(t.svc.ledger.backlog).toBe(0)
    // Nothing written before is lost: every stored file reads back whole, every served chat is billed.
    for (const s of stored)
      expect(await (await t.fetch(`/v1/files/${s.id}/content`)).text()).toBe(content(s.i))
    const usage = (await (await t.fetch('/v1/usage', { key: t.masterKey })).json()) as {
      data: { model: string; requests: number }[]
    }
    expect(usage.data.find((d) => d.model === 'test/chat')?.requests).toBe(served + 6)
    expect(
      (await t.fetch('/v1/keys', { method: 'POST', key: t.masterKey, body: JSON.stringify({ name: 'k' }) }))
        .status,
    ).toBe(201)
  }, 60_000)
})
