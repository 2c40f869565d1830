import { openPostgresStore } from './postgres/store.ts'
import { openSqliteStore } from './sqlite/store.ts'
import type { Store } from './store.ts'

/**
 * The store the config names: the embedded SQLite file, or PostgreSQL shared by several nodes.
 * `role` is who uses the connection: the event loop, or a thread (see WAL_CHECKPOINT_BYTES).
 */
/** The storage settings the store needs (config/load.ts's `storage` section is one). */
export interface StorageSettings {
  readonly kind: 'sqlite' | 'postgres'
  readonly postgresUrl?: string | undefined
  readonly postgresMaxConnections: number
  readonly statementTimeoutMs: number
  readonly sqlitePath: string
  readonly sqliteStartupCheck: Parameters<typeof openSqliteStore>[2]
}

export async function openStore(
  s: StorageSettings,
  role: 'eventLoop' | 'thread' = 'eventLoop',
): Promise<Store> {
  if (s.kind === 'postgres')
    return openPostgresStore({
      url: s.postgresUrl!,
      maxConnections: s.postgresMaxConnections,
      statementTimeoutMs: s.statementTimeoutMs,
    })
  // The event loop opens it first, at start, and reads it through; the threads open it after.
  return openSqliteStore(s.sqlitePath, role, role === 'eventLoop' ? s.sqliteStartupCheck : 'off')
}
