import { Database } from 'bun:sqlite'
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI from 'openai'
import { rubNumberToNano } from '../../src/billing/money.ts'
import { startSimFleet } from '../../src/simulator/index.ts'
import { startChatBatch } from '../helpers/batches.ts'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN, defaultModels } from '../helpers/start.ts'

// The embedded default's exactness with one process and with several sharing the port
// (server.workers, docs/workers.md): the same checks over real HTTP, each request on a
// connection of its own, so the kernel spreads them over the workers.
const fleet = await startSimFleet(
  [1, 2].map((i) => ({ name: `sim-${i}`, itlMs: 2, prefillTokensPerSec: 50_000, seed: i })),
)
afterAll(() => fleet.stop())

/** Writes a router config of `workers` processes into `dir` (its data dir too); returns its path. */
function writeConfig(dir: string, workers: number, rest: Record<string, unknown>): string {
  const path = join(dir, 'tropa.json')
  writeFileSync(
    path,
    JSON.stringify({
      server: { data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'error', workers },
      ...rest,
    }),
  )
  return path
}

/** A fetch that opens a connection per request (no keep-alive), for the SDK too. */
const freshFetch = ((url: string | URL | Request, init?: RequestInit) =>
  fetch(url, { ...init, keepalive: false })) as typeof fetch

const sdk = (url: string, key: string) =>
  new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0, fetch: freshFetch })

const status = (p: Promise<unknown>) =>
  p.then(
    () => 200,
    (err) => (err as { status?: number }).status ?? -1,
  )

describe.each([1, 2])('%i worker(s)', (workers) => {
  const dir = mkdtempSync(join(tmpdir(), `tropa-workers-${workers}-`))
  let router: Awaited<ReturnType<typeof startRouterProcess>>
  let url: string
  beforeAll(async () => {
    const configPath = writeConfig(dir, workers, {
      batches: { tick_ms: 50 },
      models: defaultModels(fleet.nodes),
    })
    router = await startRouterProcess(configPath, freePort(), { TROPA_WORKERS: String(workers) })
    url = router.url
    // Every worker answers before the checks start (each reports its number on /health).
    const seen = new Set<number>()
    for (let i = 0; i < 500 && seen.size < workers; i++) {
      const h = (await (await freshFetch(`${url}/health`)).json()) as { worker?: number }
      seen.add(h.worker ?? 0)
      if (seen.size < workers) await Bun.sleep(10)
    }
    expect(seen.size).toBe(workers)
  })
  afterAll(async () => {
    router.proc.kill('SIGTERM')
    expect(await router.proc.exited).toBe(0)
    rmSync(dir, { recursive: true, force: true })
  })

  const newOrg = async (name: string, balanceRub: number) =>
    (await jsonCall(url, '/v1/admin/organizations', ADMIN_TOKEN, { name, balance_rub: balanceRub })) as {
      id: string
      master_key: string
    }
  const chat = (client: OpenAI, i: number) =>
    client.chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: `hello ${i}` }],
      max_tokens: 20,
    })
  const ledger = (orgId: string) => {
    const db = new Database(join(dir, 'tropa.db'), { readonly: true })
    try {
      return db
        .query("SELECT request_id, cost_nano, batch_id FROM ledger WHERE org_id = ? AND kind = 'usage'")
        .all(orgId) as { request_id: string; cost_nano: bigint | number; batch_id: string | null }[]
    } finally {
      db.close()
    }
  }

  /** The organization's usage rows once `count` are in (the ledger's group commit, every 250 ms, is later on a busy machine). */
  const ledgerOnce = async (orgId: string, count: number) => {
    let rows = ledger(orgId)
    for (let i = 0; i < 100 && rows.length < count; i++) {
      await Bun.sleep(50)
      rows = ledger(orgId)
    }
    return rows
  }

  test("a key's limit is never exceeded by concurrent requests, and what it shows is the ledger", async () => {
    const org = await newOrg(`limit-${workers}`, 100)
    const limitRub = 0.03
    const key = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'k', limit_rub: limitRub })) as {
      key_id: string
      key: string
    }
    const client = sdk(url, key.key)
    const codes = await Promise.all(Array.from({ length: 80 }, (_, i) => status(chat(client, i))))
    expect(codes.filter((c) => c === 200).length).toBeGreaterThan(3)
    expect(codes.filter((c) => c === 402).length).toBeGreaterThan(0)
    expect(codes.every((c) => c === 200 || c === 402)).toBe(true)
    // Shown by any worker (asked on fresh connections): the spend, never above the limit.
    const shown = (await jsonCall(url, `/v1/keys/${key.key_id}`, org.master_key)) as { spent_rub: number }
    expect(shown.spent_rub).toBeLessThanOrEqual(limitRub)
    const served = codes.filter((c) => c === 200).length
    const rows = await ledgerOnce(org.id, served)
    expect(rows.length).toBe(served)
    const sum = rows.reduce((a, r) => a + BigInt(r.cost_nano), 0n)
    expect(sum).toBeLessThanOrEqual(rubNumberToNano(limitRub)!)
    expect(rubNumberToNano(shown.spent_rub)).toBe(sum)
  })

  test("an organization's balance never goes below zero, and every worker shows the same", async () => {
    const balanceRub = 0.02
    const org = await newOrg(`balance-${workers}`, balanceRub)
    const key = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'k' })) as { key: string }
    const client = sdk(url, key.key)
    const codes = await Promise.all(Array.from({ length: 60 }, (_, i) => status(chat(client, i))))
    expect(codes.filter((c) => c === 402).length).toBeGreaterThan(0)
    const sum = (await ledgerOnce(org.id, codes.filter((c) => c === 200).length)).reduce(
      (a, r) => a + BigInt(r.cost_nano),
      0n,
    )
    expect(sum).toBeLessThanOrEqual(rubNumberToNano(balanceRub)!)
    const shown = await Promise.all(
      Array.from(
        { length: 6 },
        async () =>
          (
            (await (
              await freshFetch(`${url}/v1/organization`, {
                headers: { authorization: `Bearer ${org.master_key}` },
              })
            ).json()) as { balance_rub: number }
          ).balance_rub,
      ),
    )
    for (const b of shown) expect(rubNumberToNano(b)).toBe(rubNumberToNano(balanceRub)! - sum)
  })

  test("a key's period budget is never exceeded, and every worker shows what it spent", async () => {
    const org = await newOrg(`budget-${workers}`, 100)
    const amountRub = 0.02
    const key = (await jsonCall(url, '/v1/keys', org.master_key, {
      name: 'k',
      budget: { amount_rub: amountRub, period: 'day', timezone: 'UTC' },
    })) as { key_id: string; key: string }
    const client = sdk(url, key.key)
    const codes = await Promise.all(Array.from({ length: 60 }, (_, i) => status(chat(client, i))))
    expect(codes.filter((c) => c === 402).length).toBeGreaterThan(0)
    const sum = (await ledgerOnce(org.id, codes.filter((c) => c === 200).length)).reduce(
      (a, r) => a + BigInt(r.cost_nano),
      0n,
    )
    expect(sum).toBeLessThanOrEqual(rubNumberToNano(amountRub)!)
    for (let i = 0; i < 4; i++) {
      const shown = (await jsonCall(url, `/v1/keys/${key.key_id}`, org.master_key)) as {
        budget: { spent_rub: number; reserved_rub: number }
      }
      expect(rubNumberToNano(shown.budget.spent_rub)).toBe(sum)
      expect(shown.budget.reserved_rub).toBe(0)
    }
  })

  test('a rate limit admits exactly its requests per minute across workers', async () => {
    const org = await newOrg(`rate-${workers}`, 100)
    const key = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'k', rpm_limit: 12 })) as {
      key: string
    }
    const client = sdk(url, key.key)
    const codes = await Promise.all(Array.from({ length: 40 }, (_, i) => status(chat(client, i))))
    expect(codes.filter((c) => c === 200).length).toBe(12)
    expect(codes.filter((c) => c === 429).length).toBe(28)
  })

  test('a revoked key is refused by every worker as soon as DELETE answered', async () => {
    const org = await newOrg(`revoke-${workers}`, 100)
    const key = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'k' })) as {
      key_id: string
      key: string
    }
    const client = sdk(url, key.key)
    // Every worker has served the key (it is in each one's memory).
    const before = await Promise.all(Array.from({ length: 12 }, (_, i) => status(chat(client, i))))
    expect(before.every((c) => c === 200)).toBe(true)
    const del = await freshFetch(`${url}/v1/keys/${key.key_id}`, {
      method: 'DELETE',
      headers: { authorization: `Bearer ${org.master_key}` },
    })
    expect(del.status).toBe(200)
    const after = await Promise.all(Array.from({ length: 24 }, (_, i) => status(chat(client, i))))
    expect(after.every((c) => c === 401)).toBe(true)
  })

  test('/metrics answers for every process, each series labelled with its worker', async () => {
    const org = await newOrg(`metrics-${workers}`, 100)
    const key = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'k' })) as { key: string }
    const client = sdk(url, key.key)
    const before = await upstreamRequests()
    await Promise.all(Array.from({ length: 20 }, (_, i) => chat(client, i)))
    const text = await (await freshFetch(`${url}/metrics`)).text()
    // One group per family, whoever answered.
    expect(text.match(/^# TYPE tropa_upstream_requests_total /gm)?.length).toBe(1)
    if (workers > 1) {
      for (const w of ['primary', ...Array.from({ length: workers }, (_, i) => String(i))])
        expect(text).toContain(`worker="${w}"`)
      // What is read from the store, or held by the primary, is reported once: by the primary.
      expect(text.match(/^tropa_ledger_queue_depth\{.*$/gm)).toEqual([
        expect.stringContaining('worker="primary"'),
      ])
      for (const line of text.match(/^tropa_batches\{.*$/gm) ?? []) expect(line).toContain('worker="primary"')
    }
    expect((await upstreamRequests()) - before).toBe(20)
  })

  /** Requests sent upstream, summed over every process's series. */
  const upstreamRequests = async () => {
    const text = await (await freshFetch(`${url}/metrics`)).text()
    let n = 0
    for (const m of text.matchAll(/^tropa_upstream_requests_total\{[^}]*\} (\d+)$/gm)) n += Number(m[1])
    return n
  }

  test('a batch runs each line once, billed once', async () => {
    const org = await newOrg(`batch-${workers}`, 100)
    const key = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'k' })) as { key: string }
    const client = sdk(url, key.key)
    const n = 40
    const batch = await startChatBatch(client, n, { prefix: `w${workers}` })
    let b = batch
    for (let i = 0; i < 1500 && b.status !== 'completed' && b.status !== 'failed'; i++) {
      await Bun.sleep(20)
      b = await client.batches.retrieve(batch.id)
    }
    expect(b.status).toBe('completed')
    expect(b.request_counts).toEqual({ total: n, completed: n, failed: 0 })
    const text = await (await client.files.content(b.output_file_id!)).text()
    const ids = text
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { custom_id: string }).custom_id)
    expect(ids.length).toBe(n)
    expect(new Set(ids).size).toBe(n)
    const rows = (await ledgerOnce(org.id, n)).filter((r) => r.batch_id === batch.id)
    expect(rows.length).toBe(n)
    expect(new Set(rows.map((r) => r.request_id)).size).toBe(n)
  })
})

test('several workers: one killed is started again, its holds come back; SIGTERM stops them all', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-workers-death-'))
  const configPath = writeConfig(dir, 2, { models: defaultModels(fleet.nodes) })
  const router = await startRouterProcess(configPath, freePort(), { TROPA_WORKERS: '2' })
  const url = router.url
  const pids = async () => {
    const seen = new Map<number, number>()
    for (let i = 0; i < 200 && seen.size < 2; i++) {
      // A connection the kernel had queued for the killed worker is reset (SO_REUSEPORT): ask again.
      const h = (await freshFetch(`${url}/health`).then(
        (r) => r.json(),
        () => undefined,
      )) as { worker: number; pid: number } | undefined
      if (h) seen.set(h.worker, h.pid)
      // The second worker may still be starting (the router is ready once one answers).
      if (seen.size < 2) await Bun.sleep(10)
    }
    return seen
  }
  try {
    const before = await pids()
    expect(before.size).toBe(2)
    const org = (await jsonCall(url, '/v1/admin/organizations', ADMIN_TOKEN, {
      name: 'death',
      balance_rub: 100,
    })) as { id: string; master_key: string }
    const key = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'k', limit_rub: 1 })) as {
      key: string
    }
    const client = sdk(url, key.key)
    // Slow streams in flight on both workers, then worker 0 is killed under them.
    const streams = Array.from({ length: 16 }, (_, i) =>
      client.chat.completions
        .create({
          model: 'test/chat',
          messages: [{ role: 'user', content: `long ${i}` }],
          max_tokens: 400,
          stream: true,
        })
        .then(async (s) => {
          for await (const _ of s) {
          }
        })
        .catch(() => {}),
    )
    await Bun.sleep(300)
    process.kill(before.get(0)!, 'SIGKILL')
    await Promise.all(streams)
    let after = await pids()
    for (let i = 0; i < 300 && (after.get(0) === undefined || after.get(0) === before.get(0)); i++) {
      await Bun.sleep(20)
      after = await pids()
    }
    expect(after.get(0)).toBeDefined()
    expect(after.get(0)).not.toBe(before.get(0))
    // Nothing held any more: the organization shows no money reserved, on every worker.
    for (let i = 0; i < 4; i++) {
      const o = (await (
        await freshFetch(`${url}/v1/organization`, { headers: { authorization: `Bearer ${org.master_key}` } })
      ).json()) as { reserved_rub?: number }
      expect(o.reserved_rub ?? 0).toBe(0)
    }
    router.proc.kill('SIGTERM')
    expect(await router.proc.exited).toBe(0)
    for (const pid of [...after.values()]) expect(() => process.kill(pid, 0)).toThrow()
  } finally {
    router.proc.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  }
})

test("several workers: a key's max_concurrency holds across them; SIGTERM lets every worker's streams finish", async () => {
  // Answers that run to their max_tokens (ignore_eos), so a stream lasts as long as asked.
  const long = await startSimFleet(
    [1, 2].map((i) => ({
      name: `sim-${i}`,
      itlMs: 2,
      prefillTokensPerSec: 50_000,
      seed: i,
      ignoreEos: true,
    })),
  )
  const dir = mkdtempSync(join(tmpdir(), 'tropa-workers-stop-'))
  const configPath = writeConfig(dir, 2, { models: defaultModels(long.nodes) })
  const router = await startRouterProcess(configPath, freePort(), { TROPA_WORKERS: '2' })
  const url = router.url
  try {
    const org = (await jsonCall(url, '/v1/admin/organizations', ADMIN_TOKEN, {
      name: 'stop',
      balance_rub: 100,
    })) as { id: string; master_key: string }
    const key = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'k', max_concurrency: 3 })) as {
      key: string
    }
    const other = (await jsonCall(url, '/v1/keys', org.master_key, { name: 'other' })) as { key: string }
    // Streams started at once, each long enough (1,500 tokens: 3 s of the simulator's 2 ms per
    // token) that all are admitted or refused while the first ones still run, on a loaded
    // machine too: exactly max_concurrency of them are admitted, wherever each lands.
    const stream = (k: string, i: number, tokens = 300) =>
      sdk(url, k)
        .chat.completions.create({
          model: 'test/chat',
          messages: [{ role: 'user', content: `stream ${i}` }],
          max_tokens: tokens,
          stream: true,
        })
        .then(async (s) => {
          let done = false
          for await (const c of s) if (c.choices[0]?.finish_reason) done = true
          return done ? 200 : -2
        })
        .catch((err) => (err as { status?: number }).status ?? -1)
    const limited = await Promise.all(Array.from({ length: 16 }, (_, i) => stream(key.key, i, 1500)))
    expect(limited.filter((c) => c === 200).length).toBe(3)
    expect(limited.filter((c) => c === 429).length).toBe(13)
    // In-flight streams on both workers, then SIGTERM: each finishes, then everything exits.
    const running = Array.from({ length: 12 }, (_, i) => stream(other.key, i))
    await Bun.sleep(150)
    router.proc.kill('SIGTERM')
    expect(await Promise.all(running)).toEqual(Array(12).fill(200))
    expect(await router.proc.exited).toBe(0)
    // Every admitted stream has its one ledger row: the last settlements reached the primary.
    const db = new Database(join(dir, 'tropa.db'), { readonly: true })
    const rows = db
      .query("SELECT count(*) AS n FROM ledger WHERE org_id = ? AND kind = 'usage'")
      .get(org.id) as {
      n: number
    }
    db.close()
    expect(rows.n).toBe(15)
  } finally {
    router.proc.kill('SIGKILL')
    await long.stop()
    rmSync(dir, { recursive: true, force: true })
  }
})

test('several workers: POST /v1/admin/reload on one reloads every worker and the primary; so does SIGHUP', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-workers-reload-'))
  const write = (ids: string[]) =>
    writeConfig(dir, 2, { models: ids.map((id) => ({ ...defaultModels(fleet.nodes)[0]!, id })) })
  const configPath = write(['test/chat'])
  const router = await startRouterProcess(configPath, freePort(), { TROPA_WORKERS: '2' })
  const url = router.url
  /** The models each of 8 fresh connections sees. */
  const seen = async () =>
    Promise.all(
      Array.from({ length: 8 }, async () => {
        const r = (await (
          await freshFetch(`${url}/v1/models`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
        ).json()) as { data: { id: string }[] }
        return r.data
          .map((m) => m.id)
          .sort()
          .join(',')
      }),
    )
  try {
    write(['test/chat', 'test/other'])
    const r = await freshFetch(`${url}/v1/admin/reload`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    })
    expect(r.status).toBe(200)
    // The other worker reloads on the primary's SIGHUP, a moment after this answer.
    let views = await seen()
    for (let i = 0; i < 100 && views.some((v) => v !== 'test/chat,test/other'); i++) {
      await Bun.sleep(20)
      views = await seen()
    }
    expect(new Set(views)).toEqual(new Set(['test/chat,test/other']))
    write(['test/third'])
    router.proc.kill('SIGHUP')
    for (let i = 0; i < 100 && views.some((v) => v !== 'test/third'); i++) {
      await Bun.sleep(20)
      views = await seen()
    }
    expect(new Set(views)).toEqual(new Set(['test/third']))
  } finally {
    router.proc.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  }
})
