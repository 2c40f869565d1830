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

/** A fresh tmpfs of `size` (mount's syntax), or undefined where mounting is not allowed. */
function mountTmpfs(size: string): string | undefined {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-tmpfs-'))
  const ok =
    process.platform === 'linux' &&
    Bun.spawnSync(['mount', '-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', dir], { stderr: 'ignore' })
      .exitCode === 0
  if (ok) return dir
  rmSync(dir, { recursive: true, force: true })
  return undefined
}
function unmount(dir: string | undefined) {
  if (!dir) return
  Bun.spawnSync(['umount', '-l', dir]) // lazily: a thread may still hold the database open
  rmSync(dir, { recursive: true, force: true })
}

const mounted = mountTmpfs('12m')
const mnt = mounted ?? ''
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
        files: { min_free_bytes: 0 }, // uploads may fill the disk here (the next describe keeps a reserve)
        // A lease far longer than the test: lines must come back without it running out.
        batches: { tick_ms: 50, workers: 1, lease_ms: 600_000 },
      },
    })
  })
  afterAll(async () => {
    await t?.stop()
    unmount(mounted)
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

const reserved = mountTmpfs('24m')
describe.skipIf(!reserved)('files.min_free_bytes keeps room for the database (a 24 MiB tmpfs)', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({
      extra: {
        server: { port: 0, data_dir: join(reserved!, 'data'), admin_token: ADMIN_TOKEN, log_level: 'error' },
        files: { min_free_bytes: 8 * 2 ** 20 },
      },
    })
  })
  afterAll(async () => {
    await t?.stop()
    unmount(reserved)
  })

  test('uploads stop with 507 at the reserve, mid-body too; keys and chats go on; /ready stays ready', async () => {
    await loadTokenizer()
    const chunked = (mib: number) => {
      let sent = 0
      const head = `--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--B\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n`
      const chunk = new TextEncoder().encode(`${'x'.repeat(2 ** 16 - 1)}\n`)
      return new ReadableStream<Uint8Array>({
        pull(c) {
          if (sent === 0) c.enqueue(new TextEncoder().encode(head))
          if (sent >= mib * 2 ** 20) {
            c.enqueue(new TextEncoder().encode('\r\n--B--\r\n'))
            c.close()
            return
          }
          c.enqueue(chunk)
          sent += chunk.length
        },
      })
    }
    const upload = (mib: number) =>
      t.fetch('/v1/files', {
        method: 'POST',
        body: chunked(mib),
        headers: { 'content-type': 'multipart/form-data; boundary=B' },
      })
    // 24 MiB, a reserve of 8: 12 MiB fit (checked every 8 MiB on the way); a second 12 MiB does not.
    const first = await upload(12)
    expect(first.status).toBe(200)
    const second = await upload(12)
    expect(second.status).toBe(507)
    expect(((await second.json()) as { error: { code: string } }).error.code).toBe('insufficient_storage')
    expect(readdirSync(join(reserved!, 'data', 'files'))).toHaveLength(1)
    // The database still has its room: keys and billed chats work, and the node stays ready.
    expect(
      (await t.fetch('/v1/keys', { method: 'POST', key: t.masterKey, body: JSON.stringify({ name: 'k' }) }))
        .status,
    ).toBe(201)
    const chat = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 1,
      }),
    })
    expect(chat.status).toBe(200)
    expect((await t.fetch('/ready')).status).toBe(200)
  }, 30_000)
})
