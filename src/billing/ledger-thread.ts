/// <reference lib="webworker" />
// Entry point of the ledger thread (an entry of the compiled executable): writes flushed ledger
// rows into the SQLite file with a connection of its own. See ThreadLedgerSink.

import { LedgerRows } from '../storage/ledger-rows.ts'
import { openSqliteStore, type SqliteStore } from '../storage/sqlite/store.ts'
import type { FromLedgerThread, ToLedgerThread } from './ledger-sink.ts'

declare const self: Worker
let store: SqliteStore | undefined

self.onmessage = async (ev: MessageEvent<ToLedgerThread>) => {
  const m = ev.data
  if (m.t === 'init') {
    store = openSqliteStore(m.path, 'thread')
    return
  }
  const reply = (error?: string) =>
    self.postMessage(
      (error === undefined
        ? { t: 'done', id: m.id }
        : { t: 'done', id: m.id, error }) satisfies FromLedgerThread,
    )
  try {
    if (m.t === 'write') await store!.recordLedgerRows(LedgerRows.fromWire(m.rows))
    else {
      await store?.close()
      store = undefined
    }
    reply()
  } catch (err) {
    reply(String(err))
  }
}
