import { afterAll, beforeAll, beforeEach, expect, test } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { SQL } from 'bun'
import { EMBEDDED_PG_MIGRATION_TAGS } from '../../src/storage/postgres/migrations.ts'
import { openPostgresStore } from '../../src/storage/postgres/store.ts'
import { batchRecord, storeContract } from './store.contract.ts'
import { seedUsage, seriesOf } from './usage-seed.ts'

// Real PostgreSQL on this machine (CI starts it). Each store in this file gets a database of its
// own, dropped once its test is over, so runs never see each other's rows.
const ADMIN_URL = process.env.TROPA_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test'
const admin = new SQL(ADMIN_URL)
/** The databases not dropped yet. */
const created: string[] = []
let shared: Awaited<ReturnType<typeof openPostgresStore>>
let sharedUrl = ''

/**
 * A new database; the ones made for earlier tests (done with by now) are dropped first, so the
 * drops are spread over the run: 25 of them at the end took a loaded machine past the hook's 30 s.
 */
async function freshDatabase(keep = false): Promise<string> {
  for (const old of done.splice(0)) {
    await admin.unsafe(`DROP DATABASE IF EXISTS ${old} WITH (FORCE)`)
    created.splice(created.indexOf(old), 1)
  }
  const name = `tropa_t_${process.pid}_${created.length}_${Math.floor(Math.random() * 1e6)}`
  await admin.unsafe(`CREATE DATABASE ${name}`)
  created.push(name)
  if (!keep) later.push(name)
  const u = new URL(ADMIN_URL)
  u.pathname = `/${name}`
  return u.toString()
}
/** Databases of the test running now, then of the tests before it. */
const later: string[] = []
const done: string[] = []
beforeEach(() => void done.push(...later.splice(0)))

// One hook, in order: the shared store's connections closed before its database is dropped.
afterAll(async () => {
  await shared?.close()
  for (const name of created) await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
  await admin.close()
})

storeContract('postgres', async () => openPostgresStore({ url: await freshDatabase(), maxConnections: 4 }))

test('every PostgreSQL migration file is embedded', () => {
  const dir = join(import.meta.dir, '../../src/storage/postgres/migrations')
  const files = readdirSync(dir)
    .filter((f) => f.endsWith('.sql'))
    .map((f) => f.replace(/\.sql$/, ''))
  expect(EMBEDDED_PG_MIGRATION_TAGS.sort()).toEqual(files.sort())
})

test('migration 0007 adds the per-model and per-key sums of the hours already there', async () => {
  const url = await freshDatabase()
  const store = await openPostgresStore({ url })
  await seedUsage(store, 'o1')
  const want = await seriesOf(store, 'o1')
  // As a database written before 0007 holds them: hours per key and model only, empty sums.
  const db = new SQL(url)
  await db.unsafe('DELETE FROM usage_hours_by_model')
  await db.unsafe('DELETE FROM usage_hours_by_key')
  expect(await seriesOf(store, 'o1')).not.toEqual(want)
  const text = readFileSync(
    join(import.meta.dir, '../../src/storage/postgres/migrations/0007_usage_rollups.sql'),
    'utf8',
  )
  // The statements that fill the new tables (the last two; the tables exist).
  for (const statement of text.split('--> statement-breakpoint').slice(-2)) await db.unsafe(statement)
  expect(await seriesOf(store, 'o1')).toEqual(want)
  await db.close()
  await store.close()
})

test('an unreachable server fails the start with a clear message, password redacted', async () => {
  const err = await openPostgresStore({ url: 'postgres://tropa:secret@127.0.0.1:1/none' }).catch((e) => e)
  expect(String(err.message)).toContain('cannot reach PostgreSQL at postgres://tropa:***@127.0.0.1:1/none')
  expect(String(err.message)).not.toContain('secret')
})

test('a database whose schema is newer than this executable is refused with a clear message', async () => {
  const url = await freshDatabase()
  await (await openPostgresStore({ url })).close()
  const db = new SQL(url)
  await db`INSERT INTO drizzle.__drizzle_migrations (hash, created_at) VALUES ('future', 99999999999999)`
  await db.close()
  const err = await openPostgresStore({ url }).catch((e) => e)
  expect(String(err?.message)).toContain('schema newer than this executable knows')
})

beforeAll(async () => {
  sharedUrl = await freshDatabase(true)
  shared = await openPostgresStore({ url: sharedUrl })
})

test('leasing with SKIP LOCKED: concurrent leases never hand out a line twice', async () => {
  await shared.insertOrg({ id: 'o', name: 'o', balanceNano: 0n, createdAt: 1 })
  await shared.insertBatch(
    batchRecord('b', {
      orgId: 'o',
      keyId: 'k',
      inputFileId: 'f',
      status: 'in_progress',
      total: 300,
      expiresAt: 2,
      inProgressAt: 1,
    }),
  )
  await shared.enqueueLines(
    Array.from({ length: 300 }, (_, i) => ({
      batchId: 'b',
      line: i + 1,
      customId: `c${i}`,
      body: '{}',
      attempts: 0,
    })),
  )
  const leases = await Promise.all(Array.from({ length: 12 }, () => shared.leaseLines(60_000, 40)))
  const all = leases.flat().map((l) => l.line)
  expect(all.length).toBe(300)
  expect(new Set(all).size).toBe(300)
  expect(await shared.leaseLines(60_000, 10)).toHaveLength(0)
  // Leases are timed by PostgreSQL's clock, not the caller's: a minute later by that clock (the
  // leases moved back a minute and a bit), every one has expired and is taken over.
  const db = new SQL(sharedUrl)
  try {
    await db`UPDATE batch_lines SET lease_until_ms = lease_until_ms - 61000`
  } finally {
    await db.close()
  }
  expect(await shared.leaseLines(60_000, 500)).toHaveLength(300)
  // twelve nodes finishing the batch at once: one of them writes the result files
  const claims = await Promise.all(
    Array.from({ length: 12 }, () =>
      shared.claimFinalize('b', ['in_progress', 'finalizing'], { status: 'finalizing' }, 30),
    ),
  )
  expect(claims.filter((c) => c !== undefined)).toHaveLength(1)
})
