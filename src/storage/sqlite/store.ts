import { Database, SQLiteError, type Statement } from 'bun:sqlite'
import { existsSync, mkdirSync, statSync } from 'node:fs'
import { dirname } from 'node:path'
import {
  and,
  asc,
  desc,
  eq,
  getTableColumns,
  gt,
  gte,
  inArray,
  isNotNull,
  isNull,
  lt,
  lte,
  or,
  sql,
} from 'drizzle-orm'
import { type BunSQLiteDatabase, drizzle } from 'drizzle-orm/bun-sqlite'
import {
  LEDGER_COLUMN_NAMES,
  LEDGER_COLUMNS,
  LedgerEffects,
  LedgerRows,
  ledgerNotes,
  type SqlValue,
} from '../ledger-rows.ts'
import type {
  ActivityQuery,
  BatchLine,
  BatchPatch,
  BatchRecord,
  BatchStatus,
  ConsoleSessionRecord,
  FileRecord,
  KeyListQuery,
  KeyPatch,
  KeyRecord,
  LedgerEntry,
  OrgPatch,
  OrgRecord,
  ReceiptKeyRecord,
  ResponseRecord,
  Store,
  UsageHoursQuery,
  WebhookAttempt,
  WebhookDeliveryJob,
  WebhookEventRecord,
  WebhookPatch,
  WebhookRecord,
} from '../store.ts'
import {
  HOUR_TABLES,
  type HourSumRow,
  type HourTable,
  hourParams,
  hourUpsert,
  sqlitePlaceholder,
  usageHoursQuery,
} from '../usage-hours.ts'
import { type NewWebhookEvent, webhookEventRow, webhookRow } from '../webhook-rows.ts'

import { describe, integrityProblems, isDamage, type SqliteCheck, SqliteStoreUnusable } from './check.ts'
import { embeddedMigrations, schemaNotAhead } from './migrations.ts'
import * as schema from './schema.ts'

type Db = BunSQLiteDatabase<typeof schema>

/** The time in ms by SQLite's clock ('now' is one instant through a statement). */
const NOW_MS = "CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER)"

/** Rows per multi-row INSERT of a flush: past about ten, more rows per statement gained nothing. */
const LEDGER_ROWS_PER_INSERT = 16

/** Lines failed a transaction by failOpenLines (about 2 ms of the event loop a chunk). */
const FAIL_CHUNK = 256

/**
 * When a connection checkpoints the write-ahead log (copies it into the database file, with an
 * fsync): after its own commit, once the log holds this many bytes. The ledger thread and the
 * batch workers do it at 32 MiB (a checkpoint there takes tens of ms and stalls no request):
 * against SQLite's default of 1,000 pages, the ledger's insert costs about 15% less, since a page
 * rewritten by many commits is copied once. The event loop's own connection would stall every
 * request for as long, so its bound is a safety net it never reaches while the threads write
 * (256 MiB).
 */
export const WAL_CHECKPOINT_BYTES = { thread: 32 * 1024 * 1024, eventLoop: 256 * 1024 * 1024 } as const

/**
 * The page size of a new database file: 16 KiB instead of SQLite's 4 KiB. A flush of a few
 * hundred ledger rows touches and logs a quarter as many pages, and the B-trees are shallower
 * (about 11% less CPU per row in a micro-benchmark of the ledger thread's write). A file created
 * by an earlier version keeps its page size (changing it needs a VACUUM outside WAL mode).
 */
const NEW_FILE_PAGE_SIZE = 16_384

/**
 * Opens (creating if needed) a SQLite file in WAL mode and applies the embedded migrations.
 * An existing file is first read through with `check` (the event loop's open at start; the
 * threads that open it after pass 'off'). A damaged or unopenable file throws
 * SqliteStoreUnusable, naming the file, what SQLite found and how to recover.
 */
export function openSqliteStore(
  path: string,
  role: keyof typeof WAL_CHECKPOINT_BYTES = 'eventLoop',
  check: SqliteCheck = 'off',
): SqliteStore {
  if (path !== ':memory:') mkdirSync(dirname(path), { recursive: true })
  const existed = path !== ':memory:' && existsSync(path) && statSync(path).size > 0
  let client: Database | undefined
  try {
    client = new Database(path, { create: true, safeIntegers: true, strict: true })
    client.run('PRAGMA busy_timeout = 5000')
    if (existed && check !== 'off') {
      const problems = integrityProblems(client, check)
      if (problems.length > 0) throw new SqliteStoreUnusable(path, problems, true)
    }
    return configureAndMigrate(client, path, role)
  } catch (err) {
    client?.close()
    if (err instanceof SqliteStoreUnusable) throw err
    if (isDamage(err)) throw new SqliteStoreUnusable(path, [describe(err)], true)
    if (err instanceof SQLiteError) throw new SqliteStoreUnusable(path, [describe(err)], false)
    throw err
  }
}

function configureAndMigrate(
  client: Database,
  path: string,
  role: keyof typeof WAL_CHECKPOINT_BYTES,
): SqliteStore {
  // Only takes effect on an empty file, before anything (the WAL switch included) writes it.
  client.run(`PRAGMA page_size = ${NEW_FILE_PAGE_SIZE}`)
  client.run('PRAGMA journal_mode = WAL')
  // NORMAL is durable against a process kill (the WAL is in the OS cache); only a power loss can
  // lose the last commits, which the crash-safety guarantee in docs/ does not cover.
  client.run('PRAGMA synchronous = NORMAL')
  client.run('PRAGMA foreign_keys = ON')
  client.run(`PRAGMA wal_autocheckpoint = ${Math.ceil(WAL_CHECKPOINT_BYTES[role] / pageSizeOf(client))}`)
  // Statement journals (the pages a multi-row statement touched, kept to undo it alone) in memory
  // instead of a temporary file: one write() per page was most of such a statement's cost.
  client.run('PRAGMA temp_store = MEMORY')
  const db = drizzle({ client, schema })
  // Drizzle's migrator reads a folder; inside the executable the SQL is embedded, so hand the
  // same records to the dialect directly.
  const internals = db as unknown as {
    dialect: { migrate(m: unknown, s: unknown, c: unknown): void }
    session: unknown
  }
  const migrations = embeddedMigrations()
  // Drizzle applies only migrations newer than the database's last one, so a database written
  // by a newer executable would be used silently with a schema this one does not know.
  const tracked = client
    .query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '__drizzle_migrations'")
    .get()
  const last = tracked
    ? (client.query('SELECT max(created_at) AS at FROM __drizzle_migrations').get() as {
        at: bigint | number | null
      })
    : null
  schemaNotAhead(last?.at ?? null, migrations, path)
  internals.dialect.migrate(migrations, internals.session, { migrationsFolder: '(embedded)' })
  return new SqliteStore(client, db)
}

/** The file's page size in bytes. */
export function pageSizeOf(client: Database): number {
  const row = client.query('PRAGMA page_size').get() as { page_size: number | bigint }
  return Number(row.page_size)
}

export class SqliteStore implements Store {
  constructor(
    private readonly client: Database,
    private readonly db: Db,
  ) {}

  private failStatements:
    | {
        page: Statement<{ line: bigint; customId: string }, [string, string, bigint, number]>
        fail: Statement<unknown, [string, bigint, string]>
        count: Statement<unknown, [string, number]>
      }
    | undefined

  async getMeta(key: string) {
    return this.db.select().from(schema.meta).where(eq(schema.meta.key, key)).get()?.value
  }

  async initMeta(key: string, value: string) {
    this.db.insert(schema.meta).values({ key, value }).onConflictDoNothing().run()
    return (await this.getMeta(key))!
  }
  async receiptKeys() {
    return this.db.select().from(schema.receiptKeys).orderBy(asc(schema.receiptKeys.generation)).all()
  }

  async addReceiptKey(k: ReceiptKeyRecord) {
    const added = this.db
      .insert(schema.receiptKeys)
      .values(k)
      .onConflictDoNothing()
      .returning({ kid: schema.receiptKeys.kid })
      .all()
    return added.length === 1
  }

  async insertOrg(org: OrgRecord) {
    this.db.insert(schema.orgs).values(org).run()
  }

  async getOrg(id: string) {
    return this.db.select().from(schema.orgs).where(eq(schema.orgs.id, id)).get()
  }

  async findOrgByName(name: string) {
    return this.db.select().from(schema.orgs).where(eq(schema.orgs.name, name)).get()
  }

  async updateOrg(id: string, patch: OrgPatch) {
    if (Object.keys(patch).length === 0) return this.getOrg(id)
    return this.db.update(schema.orgs).set(patch).where(eq(schema.orgs.id, id)).returning().get()
  }

  async insertKey(key: KeyRecord) {
    this.db.insert(schema.keys).values(key).run()
  }

  async getKey(id: string) {
    return this.db.select().from(schema.keys).where(eq(schema.keys.id, id)).get()
  }

  async getKeyByHash(secretHash: string) {
    return this.db.select().from(schema.keys).where(eq(schema.keys.secretHash, secretHash)).get()
  }

  async listKeys(q: KeyListQuery) {
    const k = schema.keys
    const where = and(
      eq(k.orgId, q.orgId),
      eq(k.kind, q.kind),
      q.status ? eq(k.status, q.status) : undefined,
      q.afterId ? gt(k.id, q.afterId) : undefined,
    )
    return this.db.select().from(k).where(where).orderBy(asc(k.id)).limit(q.limit).all()
  }

  async updateKey(id: string, patch: KeyPatch) {
    if (Object.keys(patch).length === 0) return this.getKey(id)
    return this.db.update(schema.keys).set(patch).where(eq(schema.keys.id, id)).returning().get()
  }

  async loadKeys() {
    return this.db.select().from(schema.keys).all()
  }

  async loadOrgs() {
    return this.db.select().from(schema.orgs).all()
  }

  /**
   * The group commit's statements, prepared once: a multi-row INSERT for whole chunks of a flush
   * (binding and stepping one statement per row was most of the ledger thread's time), a one-row
   * INSERT for the rest, and each key's and organization's summed change written once per flush.
   */
  private ledgerStatements?: {
    chunk: Statement
    one: Statement
    insertedIds: Statement<{ request_id: string }>
    org: Statement
    key: Statement
    hours: Record<HourTable, Statement>
    args: SqlValue[]
  }

  async recordLedger(entries: readonly LedgerEntry[]) {
    // A credit's reason goes in before its row: a written credit never lacks it.
    const notes = ledgerNotes(entries)
    if (notes.length > 0) this.db.insert(schema.ledgerNotes).values(notes).onConflictDoNothing().run()
    this.writeLedger(LedgerRows.of(entries))
  }

  /** A flush of the ledger writer, as columns (from the ledger thread). */
  async recordLedgerRows(rows: LedgerRows) {
    this.writeLedger(rows)
  }

  private writeLedger(rows: LedgerRows) {
    const n = rows.length
    if (n === 0) return
    const cols = LEDGER_COLUMN_NAMES.join(', ')
    const tuple = `(${Array.from({ length: LEDGER_COLUMNS }, () => '?').join(',')})`
    this.ledgerStatements ??= {
      // OR IGNORE skips a row already present (a replay). It also means the statement can never
      // fail halfway, so SQLite keeps no statement journal for it: with a plain INSERT (undone on a
      // conflict) that journal of the pages it touched was a third of the thread's CPU.
      chunk: this.client.prepare(
        `INSERT OR IGNORE INTO ledger (${cols}) VALUES ${Array.from({ length: LEDGER_ROWS_PER_INSERT }, () => tuple).join(',')}`,
      ),
      // The rows one INSERT added have consecutive rowids ending at its last (SQLite gives a new
      // row the largest rowid + 1, and this connection holds the write lock).
      insertedIds: this.client.prepare('SELECT request_id FROM ledger WHERE rowid BETWEEN ?1 AND ?2'),
      one: this.client.prepare(`INSERT OR IGNORE INTO ledger (${cols}) VALUES ${tuple}`),
      org: this.client.prepare('UPDATE orgs SET balance_nano = balance_nano + ?1 WHERE id = ?2'),
      key: this.client.prepare(
        'UPDATE keys SET spent_nano = spent_nano + ?1, last_used_at = max(coalesce(last_used_at, 0), ?2) WHERE id = ?3',
      ),
      hours: {
        hours: this.client.prepare(hourUpsert('hours', sqlitePlaceholder)),
        byModel: this.client.prepare(hourUpsert('byModel', sqlitePlaceholder)),
        byKey: this.client.prepare(hourUpsert('byKey', sqlitePlaceholder)),
      },
      args: new Array(LEDGER_COLUMNS * LEDGER_ROWS_PER_INSERT).fill(null),
    }
    const st = this.ledgerStatements
    const args = st.args
    this.client.transaction(() => {
      const effects = new LedgerEffects()
      const counted = (i: number) => effects.add(rows, i)
      const one = (i: number) => {
        rows.bind(args, 0, i)
        // Already billed (a replay after a crash): nothing to count.
        if (st.one.run(args.slice(0, LEDGER_COLUMNS)).changes === 1) counted(i)
      }
      let i = 0
      for (; i + LEDGER_ROWS_PER_INSERT <= n; i += LEDGER_ROWS_PER_INSERT) {
        for (let j = 0; j < LEDGER_ROWS_PER_INSERT; j++) rows.bind(args, j * LEDGER_COLUMNS, i + j)
        // One array binds its values by position (spreading hundreds of arguments cost more).
        const { changes, lastInsertRowid } = st.chunk.run(args)
        if (changes === LEDGER_ROWS_PER_INSERT) {
          for (let j = i; j < i + LEDGER_ROWS_PER_INSERT; j++) counted(j)
          continue
        }
        // Some were already billed (a replay after a crash): count only the rows this INSERT added.
        const last = BigInt(lastInsertRowid)
        const added = new Set(
          changes === 0 ? [] : st.insertedIds.all(last - BigInt(changes) + 1n, last).map((r) => r.request_id),
        )
        for (let j = i; j < i + LEDGER_ROWS_PER_INSERT; j++) if (added.delete(rows.requestId(j))) counted(j)
      }
      for (; i < n; i++) one(i)
      for (const [id, delta] of effects.orgs) st.org.run(delta, id)
      for (const [id, k] of effects.keys) st.key.run(k.spent, k.usedAt, id)
      for (const which of Object.keys(HOUR_TABLES) as HourTable[])
        for (const h of effects[which].values()) st.hours[which].run(...hourParams(which, h))
    })()
  }

  async ledgerForOrg(orgId: string, fromMs: number, toMs: number) {
    const l = schema.ledger
    const n = schema.ledgerNotes
    const rows = this.db
      .select({ ...getTableColumns(l), reason: n.reason })
      .from(l)
      .leftJoin(n, eq(n.requestId, l.requestId))
      .where(and(eq(l.orgId, orgId), gte(l.endedAtMs, fromMs), lt(l.endedAtMs, toMs)))
      .orderBy(asc(l.endedAtMs))
      .all()
    return rows.map((r) => ({ ...r, estimated: r.estimated === 1 }))
  }

  async usageByKeyModelDay(
    orgId: string,
    fromMs: number,
    toMs: number,
    o: { readonly endUser?: string | undefined; readonly byEndUser?: boolean } = {},
  ) {
    const l = schema.ledger
    const day = sql<string>`strftime('%Y-%m-%d', ${l.endedAtMs} / 1000, 'unixepoch')`
    const rows = this.db
      .select({
        keyId: l.keyId,
        model: l.model,
        day,
        endUser: o.byEndUser ? l.endUser : sql<null>`NULL`,
        requests: sql<bigint>`count(*)`,
        promptTokens: sql<bigint>`sum(${l.promptTokens})`,
        completionTokens: sql<bigint>`sum(${l.completionTokens})`,
        costNano: sql<bigint>`sum(${l.costNano})`,
      })
      .from(l)
      .where(
        and(
          eq(l.orgId, orgId),
          o.endUser === undefined ? undefined : eq(l.endUser, o.endUser),
          eq(l.kind, 'usage'),
          gte(l.endedAtMs, fromMs),
          lt(l.endedAtMs, toMs),
        ),
      )
      .groupBy(...(o.byEndUser ? [l.keyId, l.model, day, l.endUser] : [l.keyId, l.model, day]))
      .orderBy(day, l.keyId, l.model, ...(o.byEndUser ? [l.endUser] : []))
      .all()
    return rows.map(({ endUser, ...r }) => ({
      ...r,
      ...(o.byEndUser && { endUser }),
      requests: Number(r.requests),
      promptTokens: Number(r.promptTokens),
      completionTokens: Number(r.completionTokens),
      costNano: BigInt(r.costNano),
    }))
  }

  async periodSpend(q: {
    readonly orgId: string
    readonly keyId: string
    readonly endUser: string | null
    readonly fromMs: number
    readonly toMs: number
  }) {
    const l = schema.ledger
    const user = q.endUser === null ? undefined : eq(l.endUser, q.endUser)
    // Rows admitted in the period (ledger_admitted), and rows written before the key had a budget
    // (no admission time) that started in it: ended after the period's start (ledger_org_time).
    const admitted = this.db
      .select({ sum: sql<bigint | null>`sum(${l.costNano})` })
      .from(l)
      .where(
        and(
          eq(l.keyId, q.keyId),
          gte(l.admittedAtMs, q.fromMs),
          lt(l.admittedAtMs, q.toMs),
          isNotNull(l.admittedAtMs),
          eq(l.kind, 'usage'),
          user,
        ),
      )
      .get()
    const before = this.db
      .select({ sum: sql<bigint | null>`sum(${l.costNano})` })
      .from(l)
      .where(
        and(
          eq(l.orgId, q.orgId),
          gte(l.endedAtMs, q.fromMs),
          eq(l.kind, 'usage'),
          eq(l.keyId, q.keyId),
          isNull(l.admittedAtMs),
          gte(l.startedAtMs, q.fromMs),
          lt(l.startedAtMs, q.toMs),
          user,
        ),
      )
      .get()
    return BigInt(admitted?.sum ?? 0n) + BigInt(before?.sum ?? 0n)
  }

  async ledgerEntry(orgId: string, requestId: string) {
    const l = schema.ledger
    const rows = this.db
      .select()
      .from(l)
      .where(and(eq(l.requestId, requestId), eq(l.orgId, orgId)))
      .limit(1)
      .all()
    const r = rows[0]
    return r && { ...r, estimated: r.estimated === 1 }
  }

  async listActivity(q: ActivityQuery) {
    const l = schema.ledger
    const b = q.before
    const n = schema.ledgerNotes
    // Only credits have notes: usage pages (the default) read the ledger alone.
    const query = q.includeCredits
      ? this.db
          .select({ ...getTableColumns(l), reason: n.reason })
          .from(l)
          .leftJoin(n, eq(n.requestId, l.requestId))
          .$dynamic()
      : this.db.select().from(l).$dynamic()
    const rows = query
      .where(
        and(
          eq(l.orgId, q.orgId),
          q.includeCredits ? undefined : eq(l.kind, 'usage'),
          q.keyId === undefined ? undefined : eq(l.keyId, q.keyId),
          q.model === undefined ? undefined : eq(l.model, q.model),
          q.outcome === undefined ? undefined : eq(l.outcome, q.outcome),
          q.endUser === undefined ? undefined : eq(l.endUser, q.endUser),
          q.fromMs === undefined ? undefined : gte(l.endedAtMs, q.fromMs),
          q.toMs === undefined ? undefined : lt(l.endedAtMs, q.toMs),
          // The first term bounds the index range; the second breaks ties of one millisecond.
          b ? lte(l.endedAtMs, b.endedAtMs) : undefined,
          b ? or(lt(l.endedAtMs, b.endedAtMs), lt(l.requestId, b.requestId)) : undefined,
        ),
      )
      .orderBy(desc(l.endedAtMs), desc(l.requestId))
      .limit(q.limit)
      .all()
    return rows.map((r) => ({ ...r, estimated: r.estimated === 1 }))
  }

  async usageHours(q: UsageHoursQuery) {
    const { text, params } = usageHoursQuery(q, sqlitePlaceholder)
    const rows = this.client.query(text).all(...params) as HourSumRow[]
    return rows.map((r) => ({
      hourStart: Number(r.hour_start),
      group: r.grp === '' || r.grp === null ? null : String(r.grp),
      requests: Number(r.requests),
      promptTokens: Number(r.prompt_tokens),
      completionTokens: Number(r.completion_tokens),
      cachedTokens: Number(r.cached_tokens),
      costNano: BigInt(r.cost_nano ?? 0),
    }))
  }

  async insertFile(f: FileRecord) {
    this.db.insert(schema.files).values(f).run()
  }

  async getFile(id: string) {
    return this.db.select().from(schema.files).where(eq(schema.files.id, id)).get()
  }

  async listFiles(orgId: string, afterId: string | undefined, limit: number) {
    const f = schema.files
    return this.db
      .select()
      .from(f)
      .where(and(eq(f.orgId, orgId), isNull(f.deletedAt), afterId ? lt(f.id, afterId) : undefined))
      .orderBy(desc(f.id))
      .limit(limit)
      .all()
  }

  async markFileDeleted(id: string, atSec: number) {
    this.db.update(schema.files).set({ deletedAt: atSec }).where(eq(schema.files.id, id)).run()
  }

  async insertBatch(b: BatchRecord) {
    this.db.insert(schema.batches).values(b).run()
  }

  async getBatch(id: string) {
    return this.db.select().from(schema.batches).where(eq(schema.batches.id, id)).get() as
      | BatchRecord
      | undefined
  }

  async listBatches(orgId: string, afterId: string | undefined, limit: number) {
    const b = schema.batches
    return this.db
      .select()
      .from(b)
      .where(and(eq(b.orgId, orgId), afterId ? lt(b.id, afterId) : undefined))
      .orderBy(desc(b.id))
      .limit(limit)
      .all() as BatchRecord[]
  }

  async updateBatch(id: string, patch: BatchPatch, from?: readonly BatchStatus[]) {
    const b = schema.batches
    const row = this.db
      .update(b)
      .set(patch)
      .where(and(eq(b.id, id), from ? inArray(b.status, [...from]) : undefined))
      .returning({ id: b.id })
      .get()
    return row !== undefined
  }

  async claimFinalize(id: string, from: readonly BatchStatus[], patch: BatchPatch, staleAfterSec: number) {
    const b = schema.batches
    const now = sql<number>`CAST(strftime('%s', 'now') AS INTEGER)`
    const rows = await this.db
      .update(b)
      .set({ ...patch, finalizingAt: now })
      .where(
        and(
          eq(b.id, id),
          inArray(b.status, [...from]),
          or(isNull(b.finalizingAt), lt(b.finalizingAt, sql`${now} - ${staleAfterSec}`)),
        ),
      )
      .returning({ at: b.finalizingAt })
    const at = rows[0]?.at
    return at === undefined || at === null ? undefined : Number(at)
  }

  async releaseFinalize(id: string, from: readonly BatchStatus[], stampedAt: number) {
    const b = schema.batches
    await this.db
      .update(b)
      .set({ finalizingAt: null })
      .where(and(eq(b.id, id), inArray(b.status, [...from]), eq(b.finalizingAt, stampedAt)))
  }

  async batchesInStatus(statuses: readonly BatchStatus[]) {
    return this.db
      .select()
      .from(schema.batches)
      .where(inArray(schema.batches.status, [...statuses]))
      .all() as BatchRecord[]
  }

  async enqueueLines(lines: readonly BatchLine[]) {
    this.db.transaction((tx) => {
      for (let i = 0; i < lines.length; i += 500) {
        tx.insert(schema.batchLines)
          .values(lines.slice(i, i + 500).map((l) => ({ ...l, status: 'pending' as const })))
          .onConflictDoNothing()
          .run()
      }
    })
  }

  async leaseLines(leaseMs: number, limit: number) {
    const rows = this.client
      .query(
        `UPDATE batch_lines SET status = 'running', lease_until_ms = ${NOW_MS} + ?1, attempts = attempts + 1
         WHERE rowid IN (
           SELECT l.rowid FROM batch_lines l JOIN batches b ON b.id = l.batch_id
           WHERE b.status = 'in_progress'
             AND ((l.status = 'pending' AND l.not_before_ms <= ${NOW_MS}) OR (l.status = 'running' AND l.lease_until_ms < ${NOW_MS}))
           ORDER BY b.created_at, l.line LIMIT ?2)
         RETURNING batch_id, line, custom_id, body, attempts`,
      )
      .all(leaseMs, limit) as {
      batch_id: string
      line: bigint
      custom_id: string
      body: string
      attempts: bigint
    }[]
    return rows.map((r) => ({
      batchId: r.batch_id,
      line: Number(r.line),
      customId: r.custom_id,
      body: r.body,
      attempts: Number(r.attempts),
    }))
  }

  async releaseAllLeases() {
    const l = schema.batchLines
    const rows = this.db
      .update(l)
      .set({ status: 'pending', leaseUntilMs: null })
      .where(eq(l.status, 'running'))
      .returning({ line: l.line })
      .all()
    return rows.length
  }

  async retryLine(batchId: string, line: number, delayMs: number, notAnAttempt = false) {
    const l = schema.batchLines
    this.db
      .update(l)
      .set({
        status: 'pending',
        notBeforeMs: sql`${sql.raw(NOW_MS)} + ${delayMs}`,
        leaseUntilMs: null,
        ...(notAnAttempt && { attempts: sql`max(${l.attempts} - 1, 0)` }),
      })
      .where(and(eq(l.batchId, batchId), eq(l.line, line), eq(l.status, 'running')))
      .run()
  }

  async finishLine(batchId: string, line: number, ok: boolean, result: string, bill?: LedgerEntry) {
    const l = schema.batchLines
    const b = schema.batches
    return this.db.transaction((tx) => {
      const row = tx
        .update(l)
        .set({ status: ok ? 'done' : 'failed', result, leaseUntilMs: null })
        .where(and(eq(l.batchId, batchId), eq(l.line, line), inArray(l.status, ['pending', 'running'])))
        .returning({ line: l.line })
        .get()
      if (!row) return false
      if (bill) this.writeLedger(LedgerRows.of([bill]))
      tx.update(b)
        .set(ok ? { completed: sql`${b.completed} + 1` } : { failed: sql`${b.failed} + 1` })
        .where(eq(b.id, batchId))
        .run()
      return true
    })
  }

  /**
   * On the event loop (a cancel, an expiry, a failing batch): FAIL_CHUNK lines a transaction, with
   * statements prepared once, and the loop's other work between chunks. A line at a time through
   * the query builder took about 0.3 ms, and a 3,000-line batch's cancel stopped every request for
   * 0.5-1 s (bench/batch-yield.ts, between its runs). A line found open is failed if it still is
   * (pending or running: a worker may have leased it meanwhile), as finishLine does.
   */
  async failOpenLines(
    batchId: string,
    result: (l: Pick<BatchLine, 'line' | 'customId'>) => string,
    onlyPending = false,
  ) {
    this.failStatements ??= {
      // ?2: 'running' to take running lines too, else 'pending' again.
      page: this.client.prepare<{ line: bigint; customId: string }, [string, string, bigint, number]>(
        "SELECT line, custom_id AS customId FROM batch_lines WHERE batch_id = ?1 AND status IN ('pending', ?2) AND line > ?3 ORDER BY line LIMIT ?4",
      ),
      fail: this.client.prepare<unknown, [string, bigint, string]>(
        "UPDATE batch_lines SET status = 'failed', result = ?3, lease_until_ms = NULL WHERE batch_id = ?1 AND line = ?2 AND status IN ('pending', 'running')",
      ),
      count: this.client.prepare<unknown, [string, number]>(
        'UPDATE batches SET failed = failed + ?2 WHERE id = ?1',
      ),
    }
    const st = this.failStatements
    const also = onlyPending ? 'pending' : 'running'
    const failChunk = this.client.transaction((rows: { line: bigint; customId: string }[]) => {
      let failed = 0
      for (const r of rows)
        failed += st.fail.run(batchId, r.line, result({ line: Number(r.line), customId: r.customId })).changes
      if (failed > 0) st.count.run(batchId, failed)
      return failed
    })
    let n = 0
    let after = -1n
    for (;;) {
      const rows = st.page.all(batchId, also, after, FAIL_CHUNK)
      if (rows.length === 0) break
      n += failChunk(rows)
      if (rows.length < FAIL_CHUNK) break
      after = rows[rows.length - 1]!.line
      await new Promise((resolve) => setImmediate(resolve))
    }
    return n
  }

  async openLineCount(batchId: string) {
    const l = schema.batchLines
    const row = this.db
      .select({ n: sql<bigint>`count(*)` })
      .from(l)
      .where(and(eq(l.batchId, batchId), inArray(l.status, ['pending', 'running'])))
      .get()
    return Number(row?.n ?? 0)
  }

  async lineResults(batchId: string, ok: boolean) {
    const l = schema.batchLines
    return this.db
      .select({ result: l.result })
      .from(l)
      .where(and(eq(l.batchId, batchId), eq(l.status, ok ? 'done' : 'failed')))
      .orderBy(asc(l.line))
      .all()
      .map((r) => r.result ?? '')
  }

  async batchCostNano(batchId: string) {
    const row = this.db
      .select({ sum: sql<bigint | null>`sum(${schema.ledger.costNano})` })
      .from(schema.ledger)
      .where(eq(schema.ledger.batchId, batchId))
      .get()
    return row?.sum ? BigInt(row.sum) : 0n
  }

  async putResponse(r: ResponseRecord) {
    this.db.insert(schema.responses).values(r).run()
  }

  async getResponse(orgId: string, id: string) {
    const r = schema.responses
    return this.db
      .select()
      .from(r)
      .where(and(eq(r.id, id), eq(r.orgId, orgId)))
      .get()
  }

  async deleteResponse(orgId: string, id: string) {
    const r = schema.responses
    const gone = this.db
      .delete(r)
      .where(and(eq(r.id, id), eq(r.orgId, orgId)))
      .returning({ id: r.id })
      .all()
    return gone.length > 0
  }

  async deleteResponsesBefore(createdAt: number, limit: number) {
    const r = schema.responses
    const ids = this.db
      .select({ id: r.id })
      .from(r)
      .where(lt(r.createdAt, createdAt))
      .limit(limit)
      .all()
      .map((x) => x.id)
    if (ids.length > 0) this.db.delete(r).where(inArray(r.id, ids)).run()
    return ids.length
  }

  async insertConsoleSession(s: ConsoleSessionRecord) {
    this.db.insert(schema.consoleSessions).values(s).run()
  }

  async getConsoleSession(id: string) {
    const c = schema.consoleSessions
    return this.db.select().from(c).where(eq(c.id, id)).get()
  }

  async touchConsoleSession(id: string, atSec: number) {
    const c = schema.consoleSessions
    this.db.update(c).set({ lastSeenAt: atSec }).where(eq(c.id, id)).run()
  }

  async deleteConsoleSession(id: string) {
    const c = schema.consoleSessions
    return this.db.delete(c).where(eq(c.id, id)).returning({ id: c.id }).all().length > 0
  }

  async deleteConsoleSessionsIdleBefore(atSec: number, limit: number) {
    const c = schema.consoleSessions
    const ids = this.db
      .select({ id: c.id })
      .from(c)
      .where(lt(c.lastSeenAt, atSec))
      .limit(limit)
      .all()
      .map((x) => x.id)
    if (ids.length > 0) this.db.delete(c).where(inArray(c.id, ids)).run()
    return ids.length
  }

  async insertWebhook(w: WebhookRecord) {
    this.db
      .insert(schema.webhooks)
      .values({ ...w, enabled: w.enabled ? 1 : 0, balanceBelow: w.balanceBelow ? 1 : 0 })
      .run()
  }

  async getWebhook(id: string) {
    const w = schema.webhooks
    const row = this.db.select().from(w).where(eq(w.id, id)).get()
    return row && webhookRow(row)
  }

  async listWebhooks(orgId?: string) {
    const w = schema.webhooks
    const q = this.db.select().from(w)
    const rows = (orgId === undefined ? q : q.where(eq(w.orgId, orgId)))
      .orderBy(asc(w.createdAt), asc(w.id))
      .all()
    return rows.map(webhookRow)
  }

  async updateWebhook(id: string, patch: WebhookPatch) {
    const w = schema.webhooks
    const { enabled, balanceBelow, ...rest } = patch
    const set = {
      ...rest,
      ...(enabled !== undefined && { enabled: enabled ? 1 : 0 }),
      ...(balanceBelow !== undefined && { balanceBelow: balanceBelow ? 1 : 0 }),
    }
    if (Object.keys(set).length > 0) this.db.update(w).set(set).where(eq(w.id, id)).run()
    return this.getWebhook(id)
  }

  async deleteWebhook(id: string) {
    return this.db.transaction((tx) => {
      tx.delete(schema.webhookEvents).where(eq(schema.webhookEvents.webhookId, id)).run()
      const w = schema.webhooks
      return tx.delete(w).where(eq(w.id, id)).returning({ id: w.id }).all().length > 0
    })
  }

  async setWebhookBalanceBelow(id: string, below: boolean, event?: NewWebhookEvent) {
    const w = schema.webhooks
    return this.db.transaction((tx) => {
      const changed =
        tx
          .update(w)
          .set({ balanceBelow: below ? 1 : 0 })
          .where(and(eq(w.id, id), eq(w.balanceBelow, below ? 0 : 1)))
          .returning({ id: w.id })
          .all().length > 0
      if (changed && event)
        tx.insert(schema.webhookEvents).values(newEventRow(event)).onConflictDoNothing().run()
      return changed
    })
  }

  async enqueueWebhookEvents(events: readonly NewWebhookEvent[]) {
    if (events.length === 0) return 0
    return this.db
      .insert(schema.webhookEvents)
      .values(events.map(newEventRow))
      .onConflictDoNothing()
      .returning({ id: schema.webhookEvents.eventId })
      .all().length
  }

  async claimWebhookEvents(nowMs: number, leaseMs: number, limit: number): Promise<WebhookDeliveryJob[]> {
    const rows = this.client
      .query(
        `UPDATE webhook_events SET lease_until_ms = ?1 + ?2, attempts = attempts + 1
         WHERE rowid IN (
           SELECT e.rowid FROM webhook_events e JOIN webhooks w ON w.id = e.webhook_id
           WHERE e.status = 'pending' AND e.next_attempt_at_ms <= ?1 AND w.enabled = 1
             AND (e.lease_until_ms IS NULL OR e.lease_until_ms < ?1)
           ORDER BY e.next_attempt_at_ms LIMIT ?3)
         RETURNING *, (SELECT url FROM webhooks WHERE id = webhook_id) AS url,
           (SELECT secret FROM webhooks WHERE id = webhook_id) AS secret`,
      )
      .all(nowMs, leaseMs, limit) as Record<string, unknown>[]
    return rows.map((r) => ({ ...webhookEventRow(r), url: String(r.url), secret: String(r.secret) }))
  }

  async finishWebhookEvent(webhookId: string, eventId: string, a: WebhookAttempt) {
    const e = schema.webhookEvents
    this.db
      .update(e)
      .set(
        a.status === 'delivered'
          ? { status: 'delivered', deliveredAtMs: a.atMs, lastStatus: a.httpStatus, leaseUntilMs: null }
          : {
              status: a.status,
              nextAttemptAtMs: a.nextAttemptAtMs,
              lastError: a.error,
              lastStatus: a.httpStatus,
              leaseUntilMs: null,
            },
      )
      .where(and(eq(e.webhookId, webhookId), eq(e.eventId, eventId), eq(e.status, 'pending')))
      .run()
  }

  async releaseWebhookLeases() {
    const e = schema.webhookEvents
    return this.db
      .update(e)
      .set({ leaseUntilMs: null })
      .where(and(eq(e.status, 'pending'), sql`${e.leaseUntilMs} IS NOT NULL`))
      .returning({ id: e.eventId })
      .all().length
  }

  async listWebhookEvents(webhookId: string, limit: number): Promise<WebhookEventRecord[]> {
    const rows = this.client
      .query(
        'SELECT * FROM webhook_events WHERE webhook_id = ?1 ORDER BY created_at_ms DESC, event_id DESC LIMIT ?2',
      )
      .all(webhookId, limit) as Record<string, unknown>[]
    return rows.map(webhookEventRow)
  }

  async pruneWebhookEvents(beforeMs: number, limit: number) {
    return this.client
      .query(
        `DELETE FROM webhook_events WHERE rowid IN (
           SELECT rowid FROM webhook_events WHERE status <> 'pending' AND created_at_ms < ?1 LIMIT ?2)
         RETURNING event_id`,
      )
      .all(beforeMs, limit).length
  }

  async close() {
    this.client.close()
  }
}

/** An event as the outbox first holds it: pending, due at once. */
function newEventRow(e: NewWebhookEvent) {
  return { ...e, status: 'pending' as const, attempts: 0, nextAttemptAtMs: e.createdAtMs }
}
