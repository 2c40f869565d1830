import { resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { ConfigError, loadConfig } from '../config/load.ts'
import { checkSqliteFile, recovery } from '../storage/sqlite/check.ts'

const HELP = `tropa store: the embedded SQLite store

Usage:
  tropa store check [flags]   read the whole file and report whether it is sound (read-only;
                              a running tropa may go on using it)

Flags:
  --data-dir <dir>   the data directory whose store to check (default ./tropa-data; also
                     TROPA_DATA_DIR); the file is storage.sqlite_path in it (tropa.db)
  --config <file>    take data_dir and storage.sqlite_path from this config (also TROPA_CONFIG)
  --path <file>      check this SQLite file
  --quick            PRAGMA quick_check (about 2 ms per MB) instead of the full
                     PRAGMA integrity_check (also checks every index against its table)

Exit status: 0 sound, 1 damaged, missing or not a Tropa store, 2 bad usage or config.`

/** `tropa store check`: runs SQLite's integrity check on the store's file and reports. */
export function runStoreCommand(argv: string[]): void {
  let values: ReturnType<typeof parse>['values']
  let positionals: string[]
  try {
    ;({ values, positionals } = parse(argv))
  } catch (err) {
    console.error(`tropa store: ${(err as Error).message}\n\n${HELP}`)
    process.exit(2)
  }
  const [verb, ...extra] = positionals
  if (values.help || !verb) return void console.log(HELP)
  if (verb !== 'check' || extra.length > 0) {
    console.error(`tropa store: unknown command ${JSON.stringify(positionals.join(' '))}\n\n${HELP}`)
    process.exit(2)
  }
  const path = storePath(values)
  const mode = values.quick ? 'quick' : 'full'
  const r = checkSqliteFile(path, mode)
  const check = mode === 'full' ? 'integrity_check' : 'quick_check'
  if (r.verdict === 'sound') {
    const size = r.bytes < 1e6 ? `${Math.ceil(r.bytes / 1e3)} kB` : `${(r.bytes / 1e6).toFixed(1)} MB`
    console.log(`ok: ${path} is sound (${check}, ${size} read in ${r.ms} ms)`)
    return
  }
  if (r.verdict === 'foreign') {
    console.error(`not a store: ${path} is ${r.problems[0]}; is --path or --data-dir right?`)
    process.exit(1)
  }
  if (r.verdict === 'missing') {
    console.error(`missing: there is no store at ${path} (a start there would create a new, empty one)`)
    process.exit(1)
  }
  console.error(
    `damaged: ${path} (${check}):\n${r.problems.map((p) => `  - ${p}`).join('\n')}\n${recovery(path)}`,
  )
  process.exit(1)
}

function parse(argv: string[]) {
  return parseArgs({
    args: argv,
    options: {
      'data-dir': { type: 'string' },
      config: { type: 'string' },
      path: { type: 'string' },
      quick: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    allowPositionals: true,
    strict: true,
  })
}

/** The file to check: --path, or the store the config (and --data-dir) names. */
function storePath(values: ReturnType<typeof parse>['values']): string {
  if (values.path) return resolve(values.path)
  let storage: ReturnType<typeof loadConfig>['storage']
  try {
    // Only the storage section is used: demo stands in for the models a server would need.
    storage = loadConfig({ configPath: values.config, dataDir: values['data-dir'], demo: true }).storage
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err
    console.error(`tropa store: ${err.message}`)
    process.exit(2)
  }
  if (storage.kind !== 'sqlite') {
    console.error(
      'tropa store: storage.kind is "postgres": this checks the embedded SQLite store; check PostgreSQL with its own tools (pg_amcheck)',
    )
    process.exit(2)
  }
  if (storage.sqlitePath === ':memory:') {
    console.error('tropa store: storage.sqlite_path is ":memory:": there is no file to check')
    process.exit(2)
  }
  return storage.sqlitePath
}
