import { Database } from 'bun:sqlite'
import { expect, test } from 'bun:test'
import { readdirSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { EMBEDDED_MIGRATION_TAGS } from '../../src/storage/sqlite/migrations.ts'
import { openSqliteStore } from '../../src/storage/sqlite/store.ts'
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
