import { Database } from 'bun:sqlite'
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI, { toFile } from 'openai'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { startSimProcess } from '../helpers/sim-process.ts'
import { ADMIN_TOKEN, defaultModels } from '../helpers/start.ts'

// SIGTERM on a real router process with 100 streams open: it stops accepting, lets them finish
// (or, past server.shutdown_grace_ms, ends each with one error event), writes every ledger row,
// and exits; a second SIGTERM exits at once.

let sim: Awaited<ReturnType<typeof startSimProcess>>
const dirs: string[] = []
let router: Awaited<ReturnType<typeof startRouterProcess>> | undefined

beforeAll(async () => {
  // 50 ms between tokens, whatever the number of streams (no per-sequence slowdown).
  sim = await startSimProcess(
    [1, 2].map((i) => ({
      name: `sim-${i}`,
      seed: i,
      itlMs: 50,
      decodeMsPerSeq: 0,
      maxSeqs: 256,
      ignoreEos: true,
    })),
  )
})
afterEach(() => {
  if (router && router.proc.exitCode === null) router.proc.kill('SIGKILL')
  router = undefined
})
afterAll(async () => {
  await sim.stop()
  for (const d of dirs) rmSync(d, { recursive: true, force: true })
})

async function startRouter(graceMs: number) {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-stop-'))
  dirs.push(dir)
  const config = join(dir, 'tropa.json')
  writeFileSync(
    config,
    JSON.stringify({
      server: { data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'error', shutdown_grace_ms: graceMs },
      routing: { hedge_share: 0 },
      models: defaultModels(sim.nodes),
    }),
  )
  router = await startRouterProcess(config, freePort())
  const org = await jsonCall(router.url, '/v1/admin/organizations', ADMIN_TOKEN, {
    name: 'stop',
    balance_rub: 1000,
  })
  const key = await jsonCall(router.url, '/v1/keys', org.master_key as string, { name: 'stop' })
  /** The organization's usage rows, read from the store's file (after the process ended). */
  const ledger = () => {
    const db = new Database(join(dir, 'tropa.db'), { readonly: true, safeIntegers: true })
    try {
      return db
        .query(
          "SELECT request_id, outcome, completion_tokens FROM ledger WHERE org_id = ? AND kind = 'usage'",
        )
        .all(org.id as string) as { request_id: string; outcome: string; completion_tokens: bigint }[]
    } finally {
      db.close()
    }
  }
  /** The batch lines' states, read from the store's file (after the process ended). */
  const lineStates = () => {
    const db = new Database(join(dir, 'tropa.db'), { readonly: true, safeIntegers: true })
    try {
      return db.query('SELECT status, lease_until_ms FROM batch_lines').all() as {
        status: string
        lease_until_ms: bigint | null
      }[]
    } finally {
      db.close()
    }
  }
  return { ...router, apiKey: key.key as string, ledger, lineStates }
}

interface Seen {
  requestId: string
  /** Content events received. */
  tokens: number
  events: string[]
  /** The body ended without a network error (a clean end). */
  clean: boolean
}

/** Opens `n` streams; resolves `opened` once each has had its first content event. */
function openStreams(url: string, apiKey: string, n: number, maxTokens: number) {
  let ready = 0
  let markOpened!: () => void
  const opened = new Promise<void>((resolve) => {
    markOpened = resolve
  })
  const done = Array.from({ length: n }, async (_, i): Promise<Seen> => {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'test/chat',
        messages: [{ role: 'user', content: `stream ${i}` }],
        stream: true,
        max_tokens: maxTokens,
      }),
    })
    expect(res.status).toBe(200)
    const seen: Seen = { requestId: res.headers.get('x-request-id')!, tokens: 0, events: [], clean: false }
    const reader = res.body!.getReader()
    const decoder = new TextDecoder()
    let buffer = ''
    let first = true
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) break
        buffer += decoder.decode(value, { stream: true })
        const parts = buffer.split('\n\n')
        buffer = parts.pop()!
        for (const e of parts) {
          seen.events.push(e)
          if (/"content":"[^"]/.test(e)) {
            seen.tokens++
            if (first) {
              first = false
              if (++ready === n) markOpened()
            }
          }
        }
      }
      seen.clean = buffer === ''
    } catch {
      seen.clean = false
    }
    return seen
  })
  return { opened, done: Promise.all(done) }
}

describe('SIGTERM with 100 streams open', () => {
  test('within the grace time: every stream ends with [DONE], new connections are refused, every row is written', async () => {
    const r = await startRouter(30_000)
    // About 3 s a stream.
    const streams = openStreams(r.url, r.apiKey, 100, 60)
    await streams.opened
    r.proc.kill('SIGTERM')
    await Bun.sleep(100)
    // Stopped accepting.
    expect(fetch(`${r.url}/ready`)).rejects.toThrow()
    const seen = await streams.done
    expect(await r.proc.exited).toBe(0)
    for (const s of seen) {
      expect(s.clean).toBe(true)
      expect(s.events.at(-1)).toBe('data: [DONE]')
      expect(s.tokens).toBe(60)
    }
    const rows = r.ledger()
    expect(rows).toHaveLength(100)
    const byId = new Map(rows.map((row) => [row.request_id, row]))
    for (const s of seen) {
      expect(byId.get(s.requestId)?.outcome).toBe('ok')
      expect(byId.get(s.requestId)?.completion_tokens).toBe(60n)
    }
  }, 60_000)

  test('past the grace time: each open stream ends cleanly with one error event, billed for what it was sent', async () => {
    const r = await startRouter(1000)
    // About 50 s a stream: far past the grace time.
    const streams = openStreams(r.url, r.apiKey, 100, 1000)
    await streams.opened
    const signalledMs = Date.now()
    r.proc.kill('SIGTERM')
    const seen = await streams.done
    expect(await r.proc.exited).toBe(0)
    expect(Date.now() - signalledMs).toBeLessThan(15_000)
    for (const s of seen) {
      expect(s.clean).toBe(true)
      const last = JSON.parse(s.events.at(-1)!.slice(6)) as { error?: { code: string; type: string } }
      expect(last.error).toMatchObject({ code: 'server_shutting_down', type: 'server_error' })
      expect(s.events).not.toContain('data: [DONE]')
    }
    const rows = r.ledger()
    expect(rows).toHaveLength(100)
    const byId = new Map(rows.map((row) => [row.request_id, row]))
    for (const s of seen) {
      const row = byId.get(s.requestId)!
      expect(row.outcome).toBe('server_shutdown')
      // Each token is one simulated word: the bill is what the client was sent.
      expect(row.completion_tokens).toBe(BigInt(s.tokens))
      expect(s.tokens).toBeLessThan(1000)
    }
  }, 60_000)

  test('batch lines running past the grace time go back to the queue, not left leased', async () => {
    const running = async () => (await sim.stats()).running
    // What the tests before left on the simulated nodes has ended.
    for (let i = 0; i < 250 && (await running()) > 0; i++) await Bun.sleep(20)
    const r = await startRouter(500)
    const client = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: r.apiKey, maxRetries: 0 })
    // Lines of about 10 s each (200 tokens, 50 ms apart).
    const rows = Array.from({ length: 8 }, (_, i) =>
      JSON.stringify({
        custom_id: `id-${i}`,
        method: 'POST',
        url: '/v1/chat/completions',
        body: { model: 'test/chat', messages: [{ role: 'user', content: `line ${i}` }], max_tokens: 200 },
      }),
    )
    const file = await client.files.create({
      file: await toFile(Buffer.from(`${rows.join('\n')}\n`), 'lines.jsonl'),
      purpose: 'batch',
    })
    await client.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    })
    for (let i = 0; i < 250 && (await running()) < 8; i++) await Bun.sleep(20)
    expect(await running()).toBe(8)
    r.proc.kill('SIGTERM')
    expect(await r.proc.exited).toBe(0)
    const states = r.lineStates()
    expect(states).toHaveLength(8)
    // Every line is back in the queue for the next start (or another node), none held by a lease.
    for (const l of states) expect(l).toEqual({ status: 'pending', lease_until_ms: null })
  }, 30_000)

  test('a second SIGTERM exits at once', async () => {
    const r = await startRouter(60_000)
    const streams = openStreams(r.url, r.apiKey, 10, 1000)
    await streams.opened
    r.proc.kill('SIGTERM')
    await Bun.sleep(300)
    // Still draining: the streams go on.
    expect(r.proc.exitCode).toBeNull()
    const signalledMs = Date.now()
    r.proc.kill('SIGTERM')
    expect(await r.proc.exited).toBe(1)
    expect(Date.now() - signalledMs).toBeLessThan(2000)
    const seen = await streams.done
    for (const s of seen) expect(s.events).not.toContain('data: [DONE]')
  }, 30_000)
})
