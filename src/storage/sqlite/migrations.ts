import m0000 from './migrations/0000_init.sql' with { type: 'text' }
import m0001 from './migrations/0001_batches.sql' with { type: 'text' }
import journal from './migrations/meta/_journal.json'

// Migrations travel inside the executable: each SQL file is imported as text here (a test
// checks that every file in migrations/ is listed).
const SQL: Record<string, string> = { '0000_init': m0000, '0001_batches': m0001 }

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
