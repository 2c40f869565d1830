import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync, mkdtempSync, readdirSync, rmSync, utimesSync, writeFileSync } from 'node:fs'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { LocalFileStore } from '../../src/files/file-store.ts'
import { loadTokenizer } from '../../src/pipeline/tokens.ts'
import { ADMIN_TOKEN, startTropa, type Tropa } from '../helpers/start.ts'

interface RawResponse {
  status: number
  headers: Record<string, string>
  body: string
}

/**
 * Sends bytes on a fresh connection and reads one response (until its Content-Length is in, or
 * the server closes). `destroyAfterMs` drops the connection that long after sending instead.
 */
function raw(
  url: string,
  parts: (string | Uint8Array)[],
  opts: { destroyAfterMs?: number } = {},
): Promise<RawResponse | undefined> {
  const u = new URL(url)
  return new Promise((resolve) => {
    const s = connect(Number(u.port), u.hostname)
    let buf = Buffer.alloc(0)
    let settled = false
    const finish = () => {
      if (settled) return
      settled = true
      s.destroy()
      const text = buf.toString('latin1')
      const end = text.indexOf('\r\n\r\n')
      if (end < 0) return resolve(undefined)
      const [statusLine, ...lines] = text.slice(0, end).split('\r\n')
      const headers: Record<string, string> = {}
      for (const l of lines) {
        const i = l.indexOf(':')
        headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim()
      }
      resolve({
        status: Number(statusLine!.split(' ')[1]),
        headers,
        body: buf.subarray(Buffer.byteLength(text.slice(0, end + 4), 'latin1')).toString('utf8'),
      })
    }
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d])
      const text = buf.toString('latin1')
      const end = text.indexOf('\r\n\r\n')
      const len = /\r\ncontent-length:\s*(\d+)/i.exec(text.slice(0, end))
      if (end >= 0 && len && buf.length >= end + 4 + Number(len[1])) finish()
    })
    s.on('error', finish)
    s.on('close', finish)
    s.on('connect', async () => {
      for (const p of parts) {
        if (settled) return
        if (!s.write(p)) await new Promise((r) => s.once('drain', r))
      }
      if (opts.destroyAfterMs !== undefined) setTimeout(finish, opts.destroyAfterMs)
    })
  })
}

const openAiError = (body: string, code: string) => {
  const e = JSON.parse(body) as { error: { message: string; type: string; param: unknown; code: string } }
  expect(e.error.code).toBe(code)
  expect(typeof e.error.message).toBe('string')
  expect(typeof e.error.type).toBe('string')
  expect('param' in e.error).toBe(true)
}

/** Polls until `f` holds (at most ~5 s); the assertion after it says what was expected. */
async function until(f: () => boolean | Promise<boolean>) {
  for (let i = 0; i < 250 && !(await f()); i++) await Bun.sleep(20)
}

const multipart = (boundary: string, name: string, content: string) =>
  `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n` +
  `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${name}"\r\n` +
  `Content-Type: application/jsonl\r\n\r\n${content}\r\n--${boundary}--\r\n`

const line = (i: number) => `{"custom_id":"c-${i}","method":"POST","url":"/v1/chat/completions","body":{}}\n`

describe('uploads never leave bytes behind', () => {
  let t: Tropa
  let filesDir: string
  beforeAll(async () => {
    t = await startTropa({ extra: { files: { max_bytes: 256 * 1024, max_lines: 1000 } } })
    filesDir = join(t.dir, 'files')
  })
  afterAll(() => t.stop())
  const onDisk = () => readdirSync(filesDir)
  const rows = async () => (await t.client().files.list()).data.length

  test('a client that goes away mid-body: its bytes are removed, no row', async () => {
    const head =
      `POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t.apiKey}\r\n` +
      `Content-Type: multipart/form-data; boundary=B\r\nContent-Length: 200000\r\n\r\n` +
      `--B\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n`
    await raw(t.url, [head, line(1).repeat(500)], { destroyAfterMs: 100 })
    await until(() => onDisk().length === 0)
    expect(onDisk()).toEqual([])
    expect(await rows()).toBe(0)
    expect((await t.fetch('/health')).status).toBe(200)
  })

  test('a truncated multipart body (no closing boundary) is 400 and leaves nothing', async () => {
    const body = `--B\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n${line(1).repeat(50)}`
    const res = await t.fetch('/v1/files', {
      method: 'POST',
      body,
      headers: { 'content-type': 'multipart/form-data; boundary=B' },
    })
    expect(res.status).toBe(400)
    openAiError(await res.text(), 'invalid_value')
    await until(() => onDisk().length === 0)
    expect(onDisk()).toEqual([])
    expect(await rows()).toBe(0)
  })

  test('a chunked body over files.max_bytes is 413 with the OpenAI body and leaves nothing', async () => {
    const chunk = new TextEncoder().encode('x'.repeat(8192)) // one long line
    let sent = 0
    const stream = new ReadableStream<Uint8Array>({
      pull(c) {
        if (sent === 0)
          c.enqueue(new TextEncoder().encode(multipart('B', 'a.jsonl', '\u0000').split('\u0000')[0]))
        if (sent++ > 200)
          c.close() // 1.6 MiB, well over 256 KiB
        else c.enqueue(chunk)
      },
    })
    const res = await t.fetch('/v1/files', {
      method: 'POST',
      body: stream,
      headers: { 'content-type': 'multipart/form-data; boundary=B' },
    })
    expect(res.status).toBe(413)
    openAiError(await res.text(), 'payload_too_large')
    await until(() => onDisk().length === 0)
    expect(onDisk()).toEqual([])
    expect(await rows()).toBe(0)
  })

  test('a file over max_lines is 400 and leaves nothing', async () => {
    const form = new FormData()
    form.set('purpose', 'batch')
    form.set('file', new Blob([line(1).repeat(1001)]), 'a.jsonl')
    const res = await t.fetch('/v1/files', { method: 'POST', body: form })
    expect(res.status).toBe(400)
    await until(() => onDisk().length === 0)
    expect(onDisk()).toEqual([])
  })

  test('form fields are bounded: a 100 KiB field is 400 and leaves nothing', async () => {
    const form = new FormData()
    form.set('purpose', 'batch')
    form.set('metadata', 'x'.repeat(100 * 1024))
    form.set('file', new Blob([line(1)]), 'a.jsonl')
    const res = await t.fetch('/v1/files', { method: 'POST', body: form })
    expect(res.status).toBe(400)
    openAiError(await res.text(), 'invalid_value')
    await until(() => onDisk().length === 0)
    expect(onDisk()).toEqual([])
  })

  test('the sweep removes idle temporary and row-less files, keeps live and fresh ones', async () => {
    const form = new FormData()
    form.set('purpose', 'batch')
    form.set('file', new Blob([line(1)]), 'live.jsonl')
    const live = (await (await t.fetch('/v1/files', { method: 'POST', body: form })).json()) as { id: string }
    const old = new Date(Date.now() - 2 * 3600_000)
    for (const name of [
      'file-orphanpart1.part',
      'file-orphanrowless1',
      'file-freshpart1.part',
      'notours.txt',
    ])
      writeFileSync(join(filesDir, name), 'x')
    for (const name of [live.id, 'file-orphanpart1.part', 'file-orphanrowless1', 'notours.txt'])
      utimesSync(join(filesDir, name), old, old)
    expect(await t.svc.files.sweep(3600_000)).toBe(2)
    expect(onDisk().sort()).toEqual([live.id, 'file-freshpart1.part', 'notours.txt'].sort())
    rmSync(join(filesDir, 'file-freshpart1.part'))
    rmSync(join(filesDir, 'notours.txt'))
    await t.client().files.delete(live.id)
  })
})

test('orphans are swept at start-up', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-sweep-'))
  mkdirSync(join(dir, 'files'))
  const old = new Date(Date.now() - 2 * 3600_000)
  for (const name of ['file-leftover1.part', 'file-leftover2']) {
    writeFileSync(join(dir, 'files', name), 'x')
    utimesSync(join(dir, 'files', name), old, old)
  }
  const t = await startTropa({
    extra: { server: { port: 0, data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'error' } },
  })
  try {
    await until(() => readdirSync(join(dir, 'files')).length === 0)
    expect(readdirSync(join(dir, 'files'))).toEqual([])
  } finally {
    await t.stop()
    rmSync(dir, { recursive: true, force: true })
  }
})

describe('body caps: Tropa answers every 413 itself, with the OpenAI body', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa()
  })
  afterAll(() => t.stop())
  const head = (path: string, type: string, length: number) =>
    `POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t.apiKey}\r\nContent-Type: ${type}\r\nContent-Length: ${length}\r\n\r\n`

  test('an upload declaring 300 MiB (over files.max_bytes and the runtime default) is a JSON 413', async () => {
    const res = await raw(t.url, [head('/v1/files', 'multipart/form-data; boundary=B', 300 * 2 ** 20)])
    expect(res?.status).toBe(413)
    openAiError(res!.body, 'payload_too_large')
  })

  test('a JSON body declaring 300 MiB is a JSON 413', async () => {
    const res = await raw(t.url, [head('/v1/chat/completions', 'application/json', 300 * 2 ** 20)])
    expect(res?.status).toBe(413)
    openAiError(res!.body, 'payload_too_large')
  })

  for (const framing of ['Content-Length', 'chunked'])
    test(`a 140 MiB upload with ${framing} (over the runtime default, under files.max_bytes) is stored`, async () => {
      const size = 140 * 2 ** 20
      const chunk = new TextEncoder().encode(`${'x'.repeat(4095)}\n`.repeat(16)) // 64 KiB
      const start = new TextEncoder().encode(multipart('B', 'big.jsonl', '\u0000').split('\u0000')[0])
      const end = new TextEncoder().encode('\r\n--B--\r\n')
      const parts = [start, ...Array.from({ length: size / chunk.length }, () => chunk), end]
      let status: number | undefined
      let text: string
      if (framing === 'Content-Length') {
        const length = parts.reduce((n, p) => n + p.length, 0)
        const res = await raw(t.url, [head('/v1/files', 'multipart/form-data; boundary=B', length), ...parts])
        status = res?.status
        text = res?.body ?? ''
      } else {
        let i = 0
        const stream = new ReadableStream<Uint8Array>({
          pull(c) {
            if (i < parts.length) c.enqueue(parts[i++]!)
            else c.close()
          },
        })
        const res = await t.fetch('/v1/files', {
          method: 'POST',
          body: stream,
          headers: { 'content-type': 'multipart/form-data; boundary=B' },
        })
        status = res.status
        text = await res.text()
      }
      expect(status).toBe(200)
      const f = JSON.parse(text) as { id: string; bytes: number }
      expect(f.bytes).toBe(size)
      await t.client().files.delete(f.id)
    })

  test('a 100 KB header is refused by the runtime (431) and the router stays up', async () => {
    const res = await raw(t.url, [
      `GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(100_000)}\r\n\r\n`,
    ])
    expect(res?.status).toBe(431)
    expect((await t.fetch('/health')).status).toBe(200)
  })
})

describe('file names', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa()
  })
  afterAll(() => t.stop())
  const upload = async (disposition: string) => {
    const body =
      `--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n` +
      `--B\r\nContent-Disposition: form-data; name="file"; ${disposition}\r\n\r\n${line(1)}\r\n--B--\r\n`
    const res = await t.fetch('/v1/files', {
      method: 'POST',
      body,
      headers: { 'content-type': 'multipart/form-data; boundary=B' },
    })
    const text = await res.text()
    expect(`${res.status} ${text}`).toStartWith('200 ')
    return JSON.parse(text) as { id: string; filename: string }
  }
  const download = (id: string) => t.fetch(`/v1/files/${id}/content`)

  test('CR/LF and other controls are stripped on the way in; the download works', async () => {
    const f = await upload(`filename*=UTF-8''evil%0D%0ASet-Cookie%3A%20x%3D1%00.jsonl`)
    expect(f.filename).toBe('evilSet-Cookie: x=1.jsonl')
    const res = await download(f.id)
    expect(res.status).toBe(200)
    expect(res.headers.get('set-cookie')).toBeNull()
    expect(await res.text()).toBe(line(1))
  })

  test('a non-ASCII name goes out per RFC 6266: ASCII fallback and filename*', async () => {
    const name = 'отчёт "итог" (1).jsonl'
    const f = await upload(
      `filename*=UTF-8''${encodeURIComponent(name).replace('(', '%28').replace(')', '%29')}`,
    )
    expect(f.filename).toBe(name)
    const cd = (await download(f.id)).headers.get('content-disposition')!
    expect(cd).toBe(
      `attachment; filename="_____ ______ (1).jsonl"; filename*=UTF-8''` +
        '%D0%BE%D1%82%D1%87%D1%91%D1%82%20%22%D0%B8%D1%82%D0%BE%D0%B3%22%20%281%29.jsonl',
    )
    expect(/^[\x20-\x7e]*$/.test(cd)).toBe(true)
  })

  test('path segments are dropped and the length is bounded', async () => {
    expect((await upload('filename="../../etc/passwd"')).filename).toBe('passwd')
    expect((await upload('filename="C:\\\\temp\\\\x.jsonl"')).filename).toBe('x.jsonl')
    const long = await upload(`filename*=UTF-8''${encodeURIComponent('ж'.repeat(300))}`)
    expect(Buffer.byteLength(long.filename)).toBeLessThanOrEqual(255)
    expect(long.filename).toBe('ж'.repeat(127))
  })

  test('a name stored before sanitizing (CR/LF in the row) still downloads', async () => {
    const id = 'file-legacycrlf1'
    await t.svc.files.contents.write(id, line(2))
    await t.svc.store.insertFile({
      id,
      orgId: t.orgId,
      filename: 'a\r\nb.jsonl',
      purpose: 'batch',
      bytes: line(2).length,
      lines: 1,
      createdAt: Math.floor(Date.now() / 1000),
      deletedAt: null,
    })
    const res = await download(id)
    expect(res.status).toBe(200)
    expect(res.headers.get('content-disposition')).toBe(
      `attachment; filename="ab.jsonl"; filename*=UTF-8''ab.jsonl`,
    )
  })
})

describe('multipart without a boundary', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa()
  })
  afterAll(() => t.stop())
  for (const path of ['/v1/files', '/v1/batches'])
    test(`POST ${path} is 400 with the OpenAI body`, async () => {
      const res = await t.fetch(path, {
        method: 'POST',
        body: 'x',
        headers: { 'content-type': 'multipart/form-data' },
      })
      expect(res.status).toBe(400)
      openAiError(await res.text(), 'invalid_value')
    })
})

describe('a full disk (ENOSPC injected through the file store test hook)', () => {
  let t: Tropa
  let store: LocalFileStore
  beforeAll(async () => {
    t = await startTropa()
    store = t.svc.files.contents as LocalFileStore
    await loadTokenizer() // /ready waits for it
  })
  afterAll(() => t.stop())
  const enospc = () => Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' })
  const upload = (content: string) => {
    const form = new FormData()
    form.set('purpose', 'batch')
    form.set('file', new Blob([content]), 'a.jsonl')
    return t.fetch('/v1/files', { method: 'POST', body: form })
  }

  test('uploads get 507, the process stays up, /ready says so, service resumes, nothing is lost', async () => {
    const before = (await (await upload(line(1).repeat(10))).json()) as { id: string }
    expect((await t.fetch('/ready')).status).toBe(200)
    store.testFault = enospc
    for (const n of [1, 30_000]) {
      const res = await upload(line(1).repeat(n))
      expect(res.status).toBe(507)
      openAiError(await res.text(), 'insufficient_storage')
    }
    expect((await t.fetch('/health')).status).toBe(200)
    const ready = await t.fetch('/ready')
    expect(ready.status).toBe(503)
    expect(await ready.json()).toEqual({ status: 'insufficient_storage' })
    expect(await (await t.fetch('/metrics')).text()).toContain('\ntropa_disk_full 1\n')
    // Only the file written before is on disk: the failed uploads left nothing.
    expect(readdirSync(join(t.dir, 'files'))).toEqual([before.id])
    // Space comes back: the watch's probe sees it without any client trying.
    store.testFault = undefined
    await until(async () => (await t.fetch('/ready')).status === 200)
    expect((await t.fetch('/ready')).status).toBe(200)
    expect(await (await t.fetch('/metrics')).text()).toContain('\ntropa_disk_full 0\n')
    expect((await upload(line(2))).status).toBe(200)
    expect(await (await t.fetch(`/v1/files/${before.id}/content`)).text()).toBe(line(1).repeat(10))
  })
})

test('files.min_free_bytes: an upload that would eat into the reserve is 507, the node stays ready', async () => {
  const t = await startTropa({ extra: { files: { min_free_bytes: Number.MAX_SAFE_INTEGER } } })
  try {
    await loadTokenizer()
    const form = new FormData()
    form.set('purpose', 'batch')
    form.set('file', new Blob([line(1)]), 'a.jsonl')
    const res = await t.fetch('/v1/files', { method: 'POST', body: form })
    expect(res.status).toBe(507)
    openAiError(await res.text(), 'insufficient_storage')
    expect(readdirSync(join(t.dir, 'files'))).toEqual([])
    // A policy refusal, not a failed write: the disk is not reported full.
    expect((await t.fetch('/ready')).status).toBe(200)
  } finally {
    await t.stop()
  }
})
