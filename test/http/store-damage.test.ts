import { Database } from 'bun:sqlite'
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import {
  closeSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  rmSync,
  statSync,
  truncateSync,
  writeSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { openSqliteStore } from '../../src/storage/sqlite/store.ts'

// A damaged SQLite store stops the start with a message naming the file, what is wrong and how
// to recover, and no stack trace; `tropa store check` tells a sound store from a damaged one.
const main = join(import.meta.dir, '../../src/main.ts')
const work = mkdtempSync(join(tmpdir(), 'tropa-damage-'))
const good = join(work, 'good.db')

beforeAll(async () => {
  const store = openSqliteStore(good)
  for (let i = 0; i < 2000; i++)
    await store.insertOrg({
      id: `org_${i}`,
      name: `organization number ${i} ${'x'.repeat(100)}`,
      balanceNano: 1_000_000_000n,
      createdAt: Date.now(),
    })
  await store.close()
  // Everything into the file itself (the copies below take the file alone).
  const db = new Database(good)
  db.run('PRAGMA wal_checkpoint(TRUNCATE)')
  db.close()
  expect(statSync(good).size).toBeGreaterThan(16 * 16_384)
})
afterAll(() => rmSync(work, { recursive: true, force: true }))

const overwrite = (path: string, at: number, length: number, byte: number) => {
  const fd = openSync(path, 'r+')
  writeSync(fd, Buffer.alloc(length, byte), 0, length, at)
  closeSync(fd)
}

/** A data dir holding the good store damaged by `damage`. */
function dataDirWith(name: string, damage: (file: string) => void): { dir: string; file: string } {
  const dir = join(work, name)
  mkdirSync(dir)
  const file = join(dir, 'tropa.db')
  copyFileSync(good, file)
  damage(file)
  return { dir, file }
}

const run = (args: string[]) => {
  const r = Bun.spawnSync([process.execPath, main, ...args], {
    cwd: work,
    stdout: 'pipe',
    stderr: 'pipe',
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work, TROPA_WORKERS: '1' },
    timeout: 30_000,
  })
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() }
}

const DAMAGES: Record<string, (file: string) => void> = {
  'garbage instead of the file': (f) => {
    const size = statSync(f).size
    rmSync(f)
    const fd = openSync(f, 'w')
    writeSync(fd, Buffer.from(Array.from({ length: size }, (_, i) => (i * 7919 + 13) % 251)))
    closeSync(fd)
  },
  'truncated to half': (f) => truncateSync(f, Math.floor(statSync(f).size / 2)),
  'truncated inside the header page': (f) => truncateSync(f, 100),
  'the middle half overwritten': (f) => {
    const size = statSync(f).size
    overwrite(f, Math.floor(size / 4), Math.floor(size / 2), 0x5a)
  },
  // Only a read of every page finds this one: the file opens, the schema reads fine.
  'the last page overwritten': (f) => overwrite(f, statSync(f).size - 16_384, 16_384, 0x11),
}

describe('a damaged SQLite store', () => {
  for (const [name, damage] of Object.entries(DAMAGES))
    test(`${name}: the server does not start, says which file and how to recover`, () => {
      const { dir, file } = dataDirWith(name.replaceAll(' ', '-'), damage)
      const r = run(['--demo', '--port', '0', '--data-dir', dir])
      expect(r.code).toBe(1)
      expect(r.out).not.toContain('Tropa demo is running')
      expect(r.err).toContain(`the SQLite store ${file} is damaged`)
      expect(r.err).toContain('Tropa does not start on a damaged store')
      expect(r.err).toContain('restore')
      expect(r.err).toContain('backup')
      expect(r.err).toContain(`tropa store check --path ${file}`)
      expect(r.err).not.toMatch(/\n\s+at /) // no stack trace
      // Refused before anything else: no admin token generated (it would never be shown).
      expect(existsSync(join(dir, 'admin-token'))).toBe(false)

      const check = run(['store', 'check', '--data-dir', dir])
      expect(check.code).toBe(1)
      expect(check.err).toContain(`damaged: ${file}`)
      expect(check.err).toMatch(/malformed|not a database|btreeInitPage|page/i)
      expect(check.err).not.toMatch(/\n\s+at /)
    }, 60_000)

  test('tropa store check reports ok on a sound store (full and quick), missing on none, not a store on another database', () => {
    const { dir, file } = dataDirWith('sound', () => {})
    const full = run(['store', 'check', '--data-dir', dir])
    expect(full.code).toBe(0)
    expect(full.out).toContain(`ok: ${file} is sound (integrity_check`)
    const quick = run(['store', 'check', '--quick', '--path', file])
    expect(quick.code).toBe(0)
    expect(quick.out).toContain('quick_check')
    const none = run(['store', 'check', '--data-dir', join(work, 'nothing-here')])
    expect(none.code).toBe(1)
    expect(none.err).toContain('missing: there is no store at')
    const other = join(work, 'other.db')
    const db = new Database(other)
    db.run('CREATE TABLE t (x INTEGER)')
    db.close()
    const foreign = run(['store', 'check', '--path', other])
    expect(foreign.code).toBe(1)
    expect(foreign.err).toContain(`not a store: ${other} is a SQLite database, but it holds no Tropa store`)
    // A check changes nothing: the sound store still opens and holds its rows.
    const store = openSqliteStore(file, 'eventLoop', 'quick')
    return store.getOrg('org_1999').then(async (org) => {
      expect(org?.name).toStartWith('organization number 1999')
      await store.close()
    })
  }, 60_000)
})
