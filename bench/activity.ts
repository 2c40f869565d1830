/**
 * GET /v1/activity and GET /v1/usage/series against a big ledger: fills a store with ROWS ledger
 * rows (default 1,000,000) over a few organizations, keys and models and 30 days, through the
 * ledger thread's own write (recordLedgerRows, 1,000-row flushes), then times what each request
 * does on the server: the store's queries plus the rows' JSON (HTTP framing excluded). Prints
 * p50/p99 per query and met/missed against the console's 50 ms. Also prints the write's CPU per
 * row with the new indexes and hourly sums against the same write without them.
 *
 *   bun bench/activity.ts                         # SQLite file in a temp dir
 *   bun bench/activity.ts --rows 200000           # smaller
 *   bun bench/activity.ts --postgres postgres://postgres@127.0.0.1:5432/test   # a fresh database there
 *   bun bench/activity.ts --insert-only           # only the write's cost
 *   bun bench/activity.ts --queries-only          # only the queries' times
 */
import { mkdtempSync, rmSync } from 'node:fs'
import os from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { SQL } from 'bun'
import { seriesHours, usageSeries } from '../src/billing/usage-series.ts'
import { activityView } from '../src/http/views.ts'
import { LedgerRows } from '../src/storage/ledger-rows.ts'
import { openPostgresStore } from '../src/storage/postgres/store.ts'
import { openSqliteStore } from '../src/storage/sqlite/store.ts'
import type { ActivityQuery, LedgerEntry, Store } from '../src/storage/store.ts'

const { values: args } = parseArgs({
  options: {
    rows: { type: 'string', default: '1000000' },
    postgres: { type: 'string' },
    'insert-only': { type: 'boolean', default: false },
    'queries-only': { type: 'boolean', default: false },
    samples: { type: 'string', default: '200' },
  },
})
const ROWS = Number(args.rows)
const SAMPLES = Number(args.samples)
const TARGET_MS = 50
const FLUSH = 1000
const DAY_MS = 86_400_000
const END_MS = Date.UTC(2026, 10, 30)
const START_MS = END_MS - 30 * DAY_MS

// Four organizations (one has most of the traffic), 10 keys each, 8 models, outcomes mostly ok.
const ORGS = ['org_big', 'org_b', 'org_c', 'org_d']
const ORG_SHARE = [0.7, 0.15, 0.1, 0.05]
const KEYS_PER_ORG = 10
const MODELS = Array.from({ length: 8 }, (_, i) => `provider/model-${i}`)
const OUTCOMES: [string, number][] = [
  ['ok', 0.975],
  ['client_disconnected', 0.015],
  ['upstream_error', 0.005],
  ['ok:capped', 0.005],
]

/** A deterministic generator (mulberry32), so runs compare. */
function rng(seed: number) {
  let a = seed
  return () => {
    a = (a + 0x6d2b79f5) | 0
    let t = Math.imul(a ^ (a >>> 15), 1 | a)
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}
const pick = <T>(r: number, items: readonly T[], weights: readonly number[]): T => {
  let acc = 0
  for (let i = 0; i < items.length; i++) {
    acc += weights[i]!
    if (r < acc) return items[i]!
  }
  return items.at(-1)!
}

/** Row `i` of `n` spread over `spanMs` ending at END_MS. */
function row(i: number, n: number, rand: () => number, spanMs: number): LedgerEntry {
  const orgId = pick(rand(), ORGS, ORG_SHARE)
  const ended = END_MS - spanMs + Math.floor((i / n) * spanMs)
  const prompt = 50 + Math.floor(rand() * 4000)
  const completion = Math.floor(rand() * 800)
  const [outcome] = pick(
    rand(),
    OUTCOMES,
    OUTCOMES.map(([, w]) => w),
  )
  return {
    requestId: `req_${i.toString(36).padStart(8, '0')}${Math.floor(rand() * 1e9).toString(36)}`,
    kind: 'usage',
    orgId,
    keyId: `key_${orgId}_${Math.floor(rand() * KEYS_PER_ORG)}`,
    model: MODELS[Math.floor(rand() * rand() * MODELS.length)]!,
    node: `node-${Math.floor(rand() * 6)}`,
    promptTokens: prompt,
    completionTokens: completion,
    costNano: BigInt(prompt * 30_000 + completion * 60_000),
    batchId: null,
    startedAtMs: ended - 200 - Math.floor(rand() * 3000),
    endedAtMs: ended,
    outcome,
    estimated: false,
    cachedTokens: rand() < 0.5 ? Math.floor(prompt * rand()) : 0,
    ttftMs: 20 + Math.floor(rand() * 400),
  }
}

/** Writes `n` rows in 1,000-row flushes; returns this thread's CPU microseconds per row. */
async function fill(store: Store, n: number, spanMs: number, seed = 1): Promise<number> {
  const rand = rng(seed)
  let cpuUs = 0
  const started = Date.now()
  for (let i = 0; i < n; i += FLUSH) {
    const batch = LedgerRows.of(
      Array.from({ length: Math.min(FLUSH, n - i) }, (_, j) => row(i + j, n, rand, spanMs)),
    )
    const before = process.cpuUsage()
    await store.recordLedgerRows(batch)
    const d = process.cpuUsage(before)
    cpuUs += d.user + d.system
    if (i % 100_000 === 0 && i > 0)
      process.stderr.write(`  ${i} rows, ${((Date.now() - started) / 1000).toFixed(0)} s\n`)
  }
  return cpuUs / n
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!
}

async function time(name: string, run: (i: number) => Promise<unknown>) {
  for (let i = 0; i < 5; i++) await run(i) // warm the caches and the JIT
  const ms: number[] = []
  for (let i = 0; i < SAMPLES; i++) {
    const t0 = performance.now()
    await run(i)
    ms.push(performance.now() - t0)
  }
  ms.sort((a, b) => a - b)
  const p50 = percentile(ms, 0.5)
  const p99 = percentile(ms, 0.99)
  return {
    query: name,
    p50_ms: +p50.toFixed(2),
    p99_ms: +p99.toFixed(2),
    target: p99 <= TARGET_MS ? 'met' : 'missed',
  }
}

/** What GET /v1/activity does: the cursor's row, a page (limit + 1) and its JSON. */
async function activityPage(store: Store, q: Omit<ActivityQuery, 'limit' | 'before'>, after?: string) {
  let before: ActivityQuery['before']
  if (after) {
    const e = await store.ledgerEntry(q.orgId, after)
    before = e && { endedAtMs: e.endedAtMs, requestId: e.requestId }
  }
  const rows = await store.listActivity({ ...q, before, limit: 101 })
  return JSON.stringify(rows.slice(0, 100).map((e) => activityView(e, 'a key')))
}

/** What GET /v1/usage/series does: whole buckets, the hours' sums, the buckets' JSON. */
async function series(
  store: Store,
  orgId: string,
  bucket: 'hour' | 'day',
  groupBy: 'model' | 'key',
  days: number,
) {
  const { fromHour, toHour } = seriesHours((END_MS - days * DAY_MS) / 1000, END_MS / 1000, bucket, 'UTC')
  const hours = await store.usageHours({ orgId, fromSec: fromHour, toSec: toHour, groupBy })
  return JSON.stringify(
    usageSeries(hours, fromHour, toHour, bucket, 'UTC').map((p) => ({ ...p, groups: [...p.groups.keys()] })),
    (_, v) => (typeof v === 'bigint' ? v.toString() : v),
  )
}

async function openFresh(): Promise<{
  store: Store
  raw?: (sql: string) => Promise<void>
  done: () => Promise<void>
}> {
  if (args.postgres) {
    const admin = new SQL(args.postgres)
    const name = `tropa_bench_activity_${process.pid}_${Math.floor(Math.random() * 1e6)}`
    await admin.unsafe(`CREATE DATABASE ${name}`)
    const u = new URL(args.postgres)
    u.pathname = `/${name}`
    const store = await openPostgresStore({ url: u.toString(), statementTimeoutMs: 600_000 })
    const raw = new SQL(u.toString())
    return {
      store,
      raw: async (q) => void (await raw.unsafe(q)),
      done: async () => {
        await raw.close()
        await store.close()
        await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
        await admin.close()
      },
    }
  }
  const dir = mkdtempSync(join(os.tmpdir(), 'tropa-bench-activity-'))
  // The ledger thread's connection (checkpoints in the writing connection, as in the router).
  const store = openSqliteStore(join(dir, 'tropa.db'), 'thread')
  const client = (store as unknown as { client: import('bun:sqlite').Database }).client
  return {
    store,
    raw: async (q) => void client.run(q),
    done: async () => {
      await store.close()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

async function seedOrgs(store: Store) {
  for (const id of ORGS) await store.insertOrg({ id, name: id, balanceNano: 10n ** 18n, createdAt: 0 })
}

/**
 * The write's cost: this commit's schema against the same write without the hourly sums per model
 * and per key (usage_hours_by_model and _by_key: their rows dropped by a trigger, the statements
 * still run), and without usage_hours as well (all three dropped). Fresh stores of 200,000 rows,
 * 4 ms apart (250 requests a second, so a 1,000-row flush holds 4 s of traffic, as in a busy
 * router), alternating; medians of three.
 */
async function insertCost() {
  const n = Math.min(ROWS, 200_000)
  const variants = ['this commit', 'without the sums per model and key', 'without any hourly table'] as const
  const runs = new Map<string, number[]>(variants.map((v) => [v, []]))
  for (let round = 0; round < 3; round++) {
    for (const variant of variants) {
      const s = await openFresh()
      await seedOrgs(s.store)
      const dropped =
        variant === 'this commit'
          ? []
          : variant === 'without the sums per model and key'
            ? ['usage_hours_by_model', 'usage_hours_by_key']
            : ['usage_hours', 'usage_hours_by_model', 'usage_hours_by_key']
      if (args.postgres && dropped.length > 0)
        await s.raw!(
          'CREATE FUNCTION no_row() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$',
        )
      for (const table of dropped) {
        if (args.postgres)
          await s.raw!(
            `CREATE TRIGGER no_${table} BEFORE INSERT ON ${table} FOR EACH ROW EXECUTE FUNCTION no_row()`,
          )
        else
          await s.raw!(`CREATE TRIGGER no_${table} BEFORE INSERT ON ${table} BEGIN SELECT RAISE(IGNORE); END`)
      }
      runs.get(variant)!.push(await fill(s.store, n, n * 4, 7 + round))
      await s.done()
    }
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
  return {
    rows_per_store: n,
    us_per_row: Object.fromEntries([...runs].map(([v, xs]) => [v, +median(xs).toFixed(2)])),
    all: Object.fromEntries([...runs].map(([v, xs]) => [v, xs.map((x) => +x.toFixed(2))])),
  }
}

const out: Record<string, unknown> = {
  store: args.postgres ? 'postgres' : 'sqlite',
  rows: ROWS,
  samples: SAMPLES,
  target_ms: TARGET_MS,
}
if (!args['insert-only']) {
  const s = await openFresh()
  await seedOrgs(s.store)
  const started = Date.now()
  out.fill_us_per_row = +(await fill(s.store, ROWS, 30 * DAY_MS)).toFixed(2)
  out.fill_seconds = (Date.now() - started) / 1000
  if (args.postgres) await s.raw!('ANALYZE')
  const store = s.store
  const big = 'org_big'
  // Cursors deep in the big organization: request ids from its oldest third.
  const deep = (
    await store.listActivity({ orgId: big, toMs: START_MS + 10 * DAY_MS, limit: SAMPLES + 5 })
  ).map((e) => e.requestId)
  const keyOf = (i: number) => `key_${big}_${i % KEYS_PER_ORG}`
  out.queries = [
    await time('activity: first page (100 rows)', () => activityPage(store, { orgId: big })),
    await time('activity: by key', (i) => activityPage(store, { orgId: big, keyId: keyOf(i) })),
    await time('activity: by model', (i) =>
      activityPage(store, { orgId: big, model: MODELS[i % MODELS.length] }),
    ),
    await time('activity: rare outcome (upstream_error)', () =>
      activityPage(store, { orgId: big, outcome: 'upstream_error' }),
    ),
    await time('activity: by key, one day', (i) =>
      activityPage(store, {
        orgId: big,
        keyId: keyOf(i),
        fromMs: START_MS + (i % 29) * DAY_MS,
        toMs: START_MS + ((i % 29) + 1) * DAY_MS,
      }),
    ),
    await time('activity: deep cursor (20-30 days back)', (i) =>
      activityPage(store, { orgId: big }, deep[i]),
    ),
    await time('activity: deep cursor, by key', (i) =>
      activityPage(store, { orgId: big, keyId: keyOf(i) }, deep[i]),
    ),
    await time('series: day by model, 30 days', () => series(store, big, 'day', 'model', 30)),
    await time('series: day by key, 30 days', () => series(store, big, 'day', 'key', 30)),
    await time('series: hour by model, 7 days', () => series(store, big, 'hour', 'model', 7)),
  ]
  await s.done()
}
if (!args['queries-only']) out.insert_cost = await insertCost()
console.log(JSON.stringify(out, null, 2))
