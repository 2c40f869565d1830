import { Database } from 'bun:sqlite'
import { existsSync, statSync } from 'node:fs'

/**
 * How thoroughly a SQLite file is read before use. `quick` is PRAGMA quick_check (every page and
 * row read, the B-trees' structure checked; about 2 ms per MB), `full` is PRAGMA integrity_check
 * (also each index against its table; about 6 times as long), `off` reads nothing up front.
 */
export type SqliteCheck = 'quick' | 'full' | 'off'

/** At most this many problems are listed (SQLite would list every damaged page). */
const MAX_PROBLEMS = 20

/** A SQLite store Tropa will not use: which file, what is wrong, how to recover. */
export class SqliteStoreUnusable extends Error {
  constructor(
    readonly path: string,
    readonly problems: readonly string[],
    readonly damaged: boolean,
  ) {
    super(
      damaged
        ? `the SQLite store ${path} is damaged, and Tropa does not start on a damaged store:\n${list(problems)}\n${recovery(path)}`
        : `cannot open the SQLite store ${path}:\n${list(problems)}`,
    )
    this.name = 'SqliteStoreUnusable'
  }
}

const list = (problems: readonly string[]) => problems.map((p) => `  - ${p}`).join('\n')

/** What an operator does about a damaged file. */
export function recovery(path: string): string {
  return `To recover:
  1. stop every tropa process that uses it;
  2. restore ${path} from your latest backup, and delete ${path}-wal and ${path}-shm beside it
     (they belong to the damaged file and would be applied to the restored one);
     without a backup, salvage what SQLite can still read with the sqlite3 tool:
       sqlite3 ${path} .recover | sqlite3 ${path}.recovered
     then move ${path}.recovered in its place (money since the last good state may be missing:
     compare the keys' spending with your upstream invoices);
  3. check the result with: tropa store check --path ${path}
     and start tropa again.`
}

/** Whether SQLite's error means the file is damaged (rather than locked, unreadable, full...). */
export function isDamage(err: unknown): boolean {
  const code = String((err as { code?: unknown })?.code ?? '')
  return (
    code.startsWith('SQLITE_CORRUPT') ||
    code === 'SQLITE_NOTADB' ||
    code === 'SQLITE_IOERR_SHORT_READ' ||
    code === 'SQLITE_FORMAT'
  )
}

/** What SQLite said, as one line: its message and result code. */
export function describe(err: unknown): string {
  const e = err as { message?: unknown; code?: unknown }
  const code = e?.code ? ` (${String(e.code)})` : ''
  return `${String(e?.message ?? err)}${code}`
}

/** Runs the check on an open connection; the problems it found, [] when the file is sound. */
export function integrityProblems(client: Database, mode: Exclude<SqliteCheck, 'off'>): string[] {
  const pragma = mode === 'full' ? 'integrity_check' : 'quick_check'
  const rows = client.query(`PRAGMA ${pragma}(${MAX_PROBLEMS})`).values() as unknown[][]
  const lines = rows.flatMap((r) => String(r[0]).split('\n')).filter((l) => l.length > 0)
  if (lines.length === 1 && lines[0] === 'ok') return []
  return lines.filter((l) => l !== '*** in database main ***')
}

export interface CheckReport {
  /**
   * `sound`; `damaged`; `missing` (no file: a start would create a new, empty store there);
   * `foreign` (a sound SQLite database that holds no Tropa store).
   */
  readonly verdict: 'sound' | 'damaged' | 'missing' | 'foreign'
  readonly path: string
  readonly mode: Exclude<SqliteCheck, 'off'>
  readonly problems: readonly string[]
  /** The file and its write-ahead log. */
  readonly bytes: number
  readonly ms: number
}

/**
 * `tropa store check`: opens the file read-only (a running tropa may go on using it), runs the
 * check and reports. Nothing is created, migrated or repaired.
 */
export function checkSqliteFile(path: string, mode: Exclude<SqliteCheck, 'off'>): CheckReport {
  const started = performance.now()
  const report = (problems: string[], verdict?: 'missing' | 'foreign'): CheckReport => ({
    verdict: verdict ?? (problems.length === 0 ? 'sound' : 'damaged'),
    path,
    mode,
    problems,
    bytes: sizeOf(path) + sizeOf(`${path}-wal`),
    ms: Math.round(performance.now() - started),
  })
  if (!existsSync(path)) return report(['the file does not exist'], 'missing')
  let client: Database | undefined
  try {
    client = new Database(path, { readonly: true })
    client.run('PRAGMA busy_timeout = 5000')
    const problems = integrityProblems(client, mode)
    // A sound SQLite file without Tropa's tables is some other database (or an empty one).
    if (problems.length === 0 && !client.query("SELECT 1 FROM sqlite_master WHERE name = 'keys'").get())
      return report(['a SQLite database, but it holds no Tropa store (no keys table)'], 'foreign')
    return report(problems)
  } catch (err) {
    return report([describe(err)])
  } finally {
    client?.close()
  }
}

const sizeOf = (file: string) => (existsSync(file) ? statSync(file).size : 0)
