import { Database } from 'bun:sqlite'
import { expect, test } from 'bun:test'
import { readdirSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { EMBEDDED_MIGRATION_TAGS } from '../../src/storage/sqlite/migrations.ts'
import { openSqliteStore, WAL_CHECKPOINT_PAGES } from '../../src/storage/sqlite/store.ts'
import { storeContract } from './store.contract.ts'

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

test('checkpoints are left to the threads: the event loop connection lets the log grow past 8,000 pages, a thread does not', async () => {
  const walPages = async (role: 'eventLoop' | 'thread') => {
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
    const pages = statSync(`${path}-wal`).size / 4096
    await store.close()
    return pages
  }
  expect(await walPages('eventLoop')).toBeGreaterThan(WAL_CHECKPOINT_PAGES.thread * 1.2)
  expect(await walPages('thread')).toBeLessThan(WAL_CHECKPOINT_PAGES.thread * 1.1)
})
