import type { Migration } from '../sqlite/migrations.ts'
import m0000 from './migrations/0000_init.sql' with { type: 'text' }
import m0001 from './migrations/0001_ledger_indexes.sql' with { type: 'text' }
import m0002 from './migrations/0002_responses.sql' with { type: 'text' }
import m0003 from './migrations/0003_activity.sql' with { type: 'text' }
import m0004 from './migrations/0004_console_sessions.sql' with { type: 'text' }
import m0005 from './migrations/0005_key_scopes.sql' with { type: 'text' }
import m0006 from './migrations/0006_ledger_notes.sql' with { type: 'text' }
import m0007 from './migrations/0007_usage_rollups.sql' with { type: 'text' }
import m0008 from './migrations/0008_webhooks.sql' with { type: 'text' }
import m0009 from './migrations/0009_rate_limits.sql' with { type: 'text' }
import m0010 from './migrations/0010_budgets.sql' with { type: 'text' }
import m0011 from './migrations/0011_receipts.sql' with { type: 'text' }
import journal from './migrations/meta/_journal.json'

// As for SQLite: the SQL travels inside the executable (a test checks every file is listed).
const SQL: Record<string, string> = {
  '0000_init': m0000,
  '0001_ledger_indexes': m0001,
  '0002_responses': m0002,
  '0003_activity': m0003,
  '0004_console_sessions': m0004,
  '0005_key_scopes': m0005,
  '0006_ledger_notes': m0006,
  '0007_usage_rollups': m0007,
  '0008_webhooks': m0008,
  '0009_rate_limits': m0009,
  '0010_budgets': m0010,
  '0011_receipts': m0011,
}

export function embeddedPgMigrations(): Migration[] {
  return journal.entries.map((e) => {
    const text = SQL[e.tag]
    if (text === undefined) throw new Error(`migration ${e.tag} is not embedded in postgres/migrations.ts`)
    return {
      sql: text.split('--> statement-breakpoint'),
      bps: e.breakpoints,
      folderMillis: e.when,
      hash: new Bun.CryptoHasher('sha256').update(text).digest('hex'),
    }
  })
}
export const EMBEDDED_PG_MIGRATION_TAGS = Object.keys(SQL)
