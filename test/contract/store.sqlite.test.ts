import { Database } from 'bun:sqlite'
import { expect, test } from 'bun:test'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { EMBEDDED_MIGRATION_TAGS } from '../../src/storage/sqlite/migrations.ts'
import { openSqliteStore, pageSizeOf, WAL_CHECKPOINT_BYTES } from '../../src/storage/sqlite/store.ts'
import { storeContract } from './store.contract.ts'
import { seedUsage, seriesOf } from './usage-seed.ts'

let n = 0
storeContract('sqlite file', async () =>
  openSqliteStore(join(tmpdir(), `tropa-store-${process.pid}-${Date.now()}-${n++}`, 'tropa.db')),
)

test('every migration file is embedded in the executable', () => {
  const dir = join(import.meta.dir, '../../src/storage/sqlite/migrations')
  const files = readdirSync(dir)
    .filter((f) => f.endsWith('.sql'))
    .map((f) => f.replace(/\.sql$/, ''))
  expect(EMBEDDED_MIGRATION_TAGS.sort()).toEqual(files.sort())
})

test('migration 0008 adds the per-model and per-key sums of the hours already there', async () => {
  const store = openSqliteStore(join(tmpdir(), `tropa-rollups-${process.pid}-${Date.now()}`, 'tropa.db'))
  await seedUsage(store, 'o1')
  const want = await seriesOf(store, 'o1')
  // As a store written before 0008 holds them: hours per key and model only, empty sums.
  const db = (store as unknown as { client: Database }).client
  db.run('DELETE FROM usage_hours_by_model')
  db.run('DELETE FROM usage_hours_by_key')
  expect(await seriesOf(store, 'o1')).not.toEqual(want)
  const text = readFileSync(
    join(import.meta.dir, '../../src/storage/sqlite/migrations/0008_usage_rollups.sql'),
    'utf8',
  )
  // The statements that fill the new tables (the last two; the tables exist).
  for (const statement of text.split('--> statement-breakpoint').slice(-2)) db.run(statement)
  expect(await seriesOf(store, 'o1')).toEqual(want)
  await store.close()
})

test('reopening a file keeps its data and applies no migration twice', async () => {
  const path = join(tmpdir(), `tropa-reopen-${process.pid}-${Date.now()}`, 'tropa.db')
  const a = openSqliteStore(path)
  await a.initMeta('x', '1')
  await a.close()
  const b = openSqliteStore(path)
  expect(await b.getMeta('x')).toBe('1')
  await b.close()
})

test('a file whose schema is newer than this executable is refused with a clear message', async () => {
  const path = join(tmpdir(), `tropa-ahead-${process.pid}-${Date.now()}`, 'tropa.db')
  await openSqliteStore(path).close()
  // A newer Tropa applied a migration this one does not carry.
  const db = new Database(path)
  db.run("INSERT INTO __drizzle_migrations (hash, created_at) VALUES ('future', 99999999999999)")
  db.close()
  expect(() => openSqliteStore(path)).toThrow(/schema newer than this executable knows/)
})

test('checkpoints are left to the threads: the event loop connection lets the log grow past 32 MiB, a thread does not', async () => {
  const walBytes = async (role: 'eventLoop' | 'thread') => {
    const path = join(tmpdir(), `tropa-wal-${role}-${process.pid}-${Date.now()}`, 'tropa.db')
    const store = openSqliteStore(path, role)
    await store.insertOrg({ id: 'o', name: 'o', balanceNano: 10n ** 18n, createdAt: 1 })
    for (let flush = 0; flush < 320; flush++)
      await store.recordLedger(
        Array.from({ length: 1000 }, (_, i) => ({
          requestId: `r-${flush}-${i}`,
          kind: 'usage' as const,
          orgId: 'o',
          keyId: null,
          model: 'm/x',
          node: 'n1',
          promptTokens: 10,
          completionTokens: 5,
          costNano: 1n,
          batchId: null,
          startedAtMs: 1,
          endedAtMs: 2,
          outcome: 'ok',
          estimated: false,
        })),
      )
    const bytes = statSync(`${path}-wal`).size
    await store.close()
    return bytes
  }
  expect(await walBytes('eventLoop')).toBeGreaterThan(WAL_CHECKPOINT_BYTES.thread * 1.2)
  expect(await walBytes('thread')).toBeLessThan(WAL_CHECKPOINT_BYTES.thread * 1.1)
})

test('a new file gets 16 KiB pages; a file of 4 KiB pages keeps them, with its checkpoint bound in its own pages', async () => {
  const dir = join(tmpdir(), `tropa-pages-${process.pid}-${Date.now()}`)
  const fresh = openSqliteStore(join(dir, 'new.db'), 'thread')
  const freshClient = (fresh as unknown as { client: Database }).client
  expect(pageSizeOf(freshClient)).toBe(16_384)
  expect(
    Number(
      (freshClient.query('PRAGMA wal_autocheckpoint').get() as { wal_autocheckpoint: bigint })
        .wal_autocheckpoint,
    ),
  ).toBe(WAL_CHECKPOINT_BYTES.thread / 16_384)
  await fresh.close()
  // A file an earlier version created, with SQLite's default page size.
  const oldPath = join(dir, 'old.db')
  const old = new Database(oldPath, { create: true })
  old.run('PRAGMA page_size = 4096')
  old.run('PRAGMA journal_mode = WAL')
  old.run('CREATE TABLE t (x)')
  old.close()
  const reopened = openSqliteStore(oldPath, 'thread')
  const client = (reopened as unknown as { client: Database }).client
  expect(pageSizeOf(client)).toBe(4096)
  expect(
    Number(
      (client.query('PRAGMA wal_autocheckpoint').get() as { wal_autocheckpoint: bigint }).wal_autocheckpoint,
    ),
  ).toBe(WAL_CHECKPOINT_BYTES.thread / 4096)
  await reopened.close()
})
