import type { Config } from '../config/load.ts'
import { openPostgresStore } from './postgres/store.ts'
import { openSqliteStore } from './sqlite/store.ts'
import type { Store } from './store.ts'

/**
 * The store the config names: the embedded SQLite file, or PostgreSQL shared by several nodes.
 * `role` is who uses the connection: the event loop, or a thread (see WAL_CHECKPOINT_BYTES).
 */
export async function openStore(
  s: Config['storage'],
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
