import m0000 from './migrations/0000_init.sql' with { type: 'text' }
import m0001 from './migrations/0001_batches.sql' with { type: 'text' }
import m0002 from './migrations/0002_ledger_indexes.sql' with { type: 'text' }
import m0003 from './migrations/0003_responses.sql' with { type: 'text' }
import m0004 from './migrations/0004_activity.sql' with { type: 'text' }
import m0005 from './migrations/0005_console_sessions.sql' with { type: 'text' }
import m0006 from './migrations/0006_key_scopes.sql' with { type: 'text' }
import m0007 from './migrations/0007_ledger_notes.sql' with { type: 'text' }
import m0008 from './migrations/0008_usage_rollups.sql' with { type: 'text' }
import m0009 from './migrations/0009_webhooks.sql' with { type: 'text' }
import m0010 from './migrations/0010_rate_limits.sql' with { type: 'text' }
import m0011 from './migrations/0011_budgets.sql' with { type: 'text' }
import m0012 from './migrations/0012_receipts.sql' with { type: 'text' }
import journal from './migrations/meta/_journal.json'

// Migrations travel inside the executable: each SQL file is imported as text here (a test
// checks that every file in migrations/ is listed).
const SQL: Record<string, string> = {
  '0000_init': m0000,
  '0001_batches': m0001,
  '0002_ledger_indexes': m0002,
  '0003_responses': m0003,
  '0004_activity': m0004,
  '0005_console_sessions': m0005,
  '0006_key_scopes': m0006,
  '0007_ledger_notes': m0007,
  '0008_usage_rollups': m0008,
  '0009_webhooks': m0009,
  '0010_rate_limits': m0010,
  '0011_budgets': m0011,
  '0012_receipts': m0012,
}

export interface Migration {
  sql: string[]
  bps: boolean
  folderMillis: number
  hash: string
}

export function embeddedMigrations(): Migration[] {
  return journal.entries.map((e) => {
    const text = SQL[e.tag]
    if (text === undefined) throw new Error(`migration ${e.tag} is not embedded in migrations.ts`)
    return {
      sql: text.split('--> statement-breakpoint'),
      bps: e.breakpoints,
      folderMillis: e.when,
      hash: new Bun.CryptoHasher('sha256').update(text).digest('hex'),
    }
  })
}
export const EMBEDDED_MIGRATION_TAGS = Object.keys(SQL)

/**
 * Refuses a database whose newest applied migration is newer than any this executable carries:
 * it was written by a newer Tropa, and this one would run on a schema it does not know.
 */
export function schemaNotAhead(
  lastAppliedMillis: bigint | number | string | null,
  migrations: readonly Migration[],
  where: string,
): void {
  if (lastAppliedMillis === null) return
  const newest = Math.max(0, ...migrations.map((m) => m.folderMillis))
  if (Number(lastAppliedMillis) > newest)
    throw new Error(
      `the database at ${where} has a schema newer than this executable knows (migration of ${new Date(Number(lastAppliedMillis)).toISOString()}, newest known ${new Date(newest).toISOString()}): run the newer tropa, or restore a matching backup`,
    )
}
