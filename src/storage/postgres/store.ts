import { SQL } from 'bun'
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
  type SQL as Query,
  sql,
} from 'drizzle-orm'
import { type BunSQLDatabase, drizzle } from 'drizzle-orm/bun-sql'
import {
  LEDGER_COLUMN_NAMES,
  LEDGER_COLUMNS,
  LedgerEffects,
  LedgerRows,
  ledgerNotes,
  type SqlValue,
} from '../ledger-rows.ts'
import { schemaNotAhead } from '../sqlite/migrations.ts'
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
  pgPlaceholder,
  usageHoursQuery,
} from '../usage-hours.ts'
import { type NewWebhookEvent, webhookEventRow, webhookRow } from '../webhook-rows.ts'

import { embeddedPgMigrations } from './migrations.ts'
import * as schema from './schema.ts'

type Db = BunSQLDatabase<typeof schema>

export interface PgOptions {
  readonly url: string
  readonly maxConnections?: number
  /** Statements running longer are cancelled by the server. */
  readonly statementTimeoutMs?: number
}

/** Advisory lock key held while migrating ("tropa" in ASCII). */
const MIGRATION_LOCK = 0x74726f7061

/** Connects (failing clearly when the server is unreachable) and applies the embedded migrations. */
export async function openPostgresStore(o: PgOptions): Promise<PostgresStore> {
  const client = new SQL({
    url: o.url,
    max: o.maxConnections ?? 10,
    connectionTimeout: 5,
    idleTimeout: 30,
    // Sent at connection start, so every pooled connection has it.
    connection: { statement_timeout: o.statementTimeoutMs ?? 10_000 },
  })
  try {
    await client`SELECT 1`
  } catch (err) {
    throw new Error(`cannot reach PostgreSQL at ${redact(o.url)}: ${(err as Error).message}`)
  }
  const db = drizzle({ client, schema })
  const internals = db as unknown as {
    dialect: { migrate(m: unknown, s: unknown, c: unknown): Promise<void> }
    session: unknown
  }
  // Nodes starting together on a fresh database would race to create the same tables: one
  // migrates while the others wait on a session lock, then find nothing left to do.
  const lock = await client.reserve()
  try {
    await lock`SELECT pg_advisory_lock(${MIGRATION_LOCK})`
    const migrations = embeddedPgMigrations()
    const [tracked] = (await lock`SELECT to_regclass('drizzle.__drizzle_migrations') IS NOT NULL AS ok`) as {
      ok: boolean
    }[]
    const last = tracked?.ok
      ? (
          (await lock`SELECT max(created_at)::text AS at FROM drizzle.__drizzle_migrations`) as {
            at: string | null
          }[]
        )[0]?.at
      : null
    schemaNotAhead(last ?? null, migrations, redact(o.url))
    await internals.dialect.migrate(migrations, internals.session, {
      migrationsFolder: '(embedded)',
    })
  } finally {
    await lock`SELECT pg_advisory_unlock(${MIGRATION_LOCK})`.catch(() => {})
    lock.release()
  }
  return new PostgresStore(client, db)
}

function redact(url: string): string {
  return url.replace(/\/\/([^:/@]+):([^@]+)@/, '//$1:***@')
}

/** Rows per INSERT statement of a ledger flush (16 parameters each; PostgreSQL allows 65,535). */
const LEDGER_ROWS_PER_INSERT = 1000

/** Open lines read a page by failOpenLines (numbers and custom ids only: a batch may hold many thousands). */
const FAIL_PAGE = 1000
/** The time in ms by PostgreSQL's clock (now() is the statement's start in autocommit). */
const NOW_MS = '(extract(epoch from now()) * 1000)::bigint'
const COST_COLUMN = LEDGER_COLUMN_NAMES.indexOf('cost_nano')
/** The texts bound() splits (a few fixed statements), split once. */
const textParts = new Map<string, string[]>()

/** SQL text with $1..$n placeholders, in order, as a Drizzle query with those values bound. */
function bound(text: string, params: readonly unknown[]): Query {
  let parts = textParts.get(text)
  if (!parts) {
    parts = text.split(/\$\d+/)
    textParts.set(text, parts)
  }
  const chunks: Query[] = []
  parts.forEach((part, i) => {
    chunks.push(sql.raw(part))
    if (i < params.length) chunks.push(sql`${params[i]}`)
  })
  return sql.join(chunks)
}

/** The upserts of a ledger write's hours, per table (usage-hours.ts). */
const HOUR_UPSERTS = Object.fromEntries(
  (Object.keys(HOUR_TABLES) as HourTable[]).map((which) => [
    which,
    hourUpsert(which, pgPlaceholder, '::bigint'),
  ]),
) as Record<HourTable, string>

/** `($1,...,$14),($15,...)` for `rows` ledger rows, kept for the sizes seen (a full chunk repeats). */
const tuplesBySize = new Map<number, string>()
function ledgerTuples(rows: number): string {
  let text = tuplesBySize.get(rows)
  if (text === undefined) {
    text = Array.from(
      { length: rows },
      (_, r) =>
        `(${Array.from({ length: LEDGER_COLUMNS }, (_, c) => `$${r * LEDGER_COLUMNS + c + 1}`).join(',')})`,
    ).join(',')
    if (tuplesBySize.size < 64) tuplesBySize.set(rows, text)
  }
  return text
}

export class PostgresStore implements Store {
  constructor(
    private readonly client: SQL,
    private readonly db: Db,
  ) {}

  async getMeta(key: string) {
    const [row] = await this.db.select().from(schema.meta).where(eq(schema.meta.key, key))
    return row?.value
  }

  async initMeta(key: string, value: string) {
    await this.db.insert(schema.meta).values({ key, value }).onConflictDoNothing()
    return (await this.getMeta(key))!
  }
  async receiptKeys() {
    return this.db.select().from(schema.receiptKeys).orderBy(asc(schema.receiptKeys.generation))
  }

  async addReceiptKey(k: ReceiptKeyRecord) {
    const added = await this.db
      .insert(schema.receiptKeys)
      .values(k)
      .onConflictDoNothing()
      .returning({ kid: schema.receiptKeys.kid })
    return added.length === 1
  }

  async insertOrg(org: OrgRecord) {
    await this.db.insert(schema.orgs).values(org)
  }

  async getOrg(id: string) {
    const [row] = await this.db.select().from(schema.orgs).where(eq(schema.orgs.id, id))
    return row
  }

  async findOrgByName(name: string) {
    const [row] = await this.db.select().from(schema.orgs).where(eq(schema.orgs.name, name))
    return row
  }

  async updateOrg(id: string, patch: OrgPatch) {
    if (Object.keys(patch).length === 0) return this.getOrg(id)
    const [row] = await this.db.update(schema.orgs).set(patch).where(eq(schema.orgs.id, id)).returning()
    return row
  }

  async insertKey(key: KeyRecord) {
    await this.db.insert(schema.keys).values(key)
  }

  async getKey(id: string) {
    const [row] = await this.db.select().from(schema.keys).where(eq(schema.keys.id, id))
    return row
  }

  async getKeyByHash(secretHash: string) {
    const [row] = await this.db.select().from(schema.keys).where(eq(schema.keys.secretHash, secretHash))
    return row
  }

  async listKeys(q: KeyListQuery) {
    const k = schema.keys
    return this.db
      .select()
      .from(k)
      .where(
        and(
          eq(k.orgId, q.orgId),
          eq(k.kind, q.kind),
          q.status ? eq(k.status, q.status) : undefined,
          q.afterId ? gt(k.id, q.afterId) : undefined,
        ),
      )
      .orderBy(asc(k.id))
      .limit(q.limit)
  }

  async updateKey(id: string, patch: KeyPatch) {
    if (Object.keys(patch).length === 0) return this.getKey(id)
    const [row] = await this.db.update(schema.keys).set(patch).where(eq(schema.keys.id, id)).returning()
    return row
  }

  loadKeys() {
    return this.db.select().from(schema.keys)
  }

  loadOrgs() {
    return this.db.select().from(schema.orgs)
  }

  /** Ledger rows given as entries (credits, batch lines): see recordLedgerRows. */
  async recordLedger(entries: readonly LedgerEntry[]) {
    // A credit's reason goes in before its row: a written credit never lacks it.
    const notes = ledgerNotes(entries)
    if (notes.length > 0) await this.db.insert(schema.ledgerNotes).values(notes).onConflictDoNothing()
    await this.recordLedgerRows(LedgerRows.of(entries))
  }

  /**
   * A flush of ledger rows in one transaction: one multi-row INSERT bound straight from the
   * columns (rows already present, a replay, are skipped and reported back), then one UPDATE per
   * organization and per key with the summed effect of the rows that went in. Plain SQL: building
   * a Drizzle query per row cost more CPU than the round trips.
   */
  async recordLedgerRows(rows: LedgerRows) {
    const n = rows.length
    if (n === 0) return
    await this.client.begin(async (tx) => {
      // A request id twice in one flush is one row, the first (as SQLite's INSERT OR IGNORE keeps).
      const byId = new Map<string, number>()
      for (let i = 0; i < n; i++) {
        const id = rows.requestId(i)
        if (!byId.has(id)) byId.set(id, i)
      }
      const order = [...byId.values()]
      const inserted: number[] = []
      for (let start = 0; start < order.length; start += LEDGER_ROWS_PER_INSERT) {
        const chunk = order.slice(start, start + LEDGER_ROWS_PER_INSERT)
        const params: SqlValue[] = new Array(chunk.length * LEDGER_COLUMNS)
        for (let j = 0; j < chunk.length; j++) {
          const at = j * LEDGER_COLUMNS
          rows.bind(params, at, chunk[j]!)
          // As text, cast by the column: 64-bit amounts sent exactly whatever the driver does with bigint.
          params[at + COST_COLUMN] = String(params[at + COST_COLUMN])
        }
        const done = (await tx.unsafe(
          `INSERT INTO ledger (${LEDGER_COLUMN_NAMES.join(', ')})
           VALUES ${ledgerTuples(chunk.length)} ON CONFLICT (request_id) DO NOTHING RETURNING request_id`,
          params,
        )) as { request_id: string }[]
        for (const r of done) inserted.push(byId.get(r.request_id)!)
      }
      const effects = new LedgerEffects()
      for (const i of inserted) effects.add(rows, i)
      for (const [id, delta] of effects.orgs)
        await tx.unsafe('UPDATE orgs SET balance_nano = balance_nano + $1::bigint WHERE id = $2', [
          delta.toString(),
          id,
        ])
      for (const [id, k] of effects.keys)
        await tx.unsafe(
          'UPDATE keys SET spent_nano = spent_nano + $1::bigint, last_used_at = greatest(coalesce(last_used_at, 0), $2) WHERE id = $3',
          [k.spent.toString(), k.usedAt, id],
        )
      for (const which of Object.keys(HOUR_TABLES) as HourTable[])
        for (const h of effects[which].values())
          await tx.unsafe(HOUR_UPSERTS[which], hourParams(which, h, true))
    })
  }

  /** One ledger row and its effect on the balance and the key's spend, unless already written. */
  private async writeLedgerRow(tx: Parameters<Parameters<Db['transaction']>[0]>[0], e: LedgerEntry) {
    const { keys, orgs, ledger } = schema
    const [inserted] = await tx
      .insert(ledger)
      .values({ ...e, estimated: e.estimated ? 1 : 0 })
      .onConflictDoNothing()
      .returning({ id: ledger.requestId })
    if (!inserted) return // already billed: a replay
    const effects = new LedgerEffects()
    effects.add(LedgerRows.of([e]), 0)
    for (const which of Object.keys(HOUR_TABLES) as HourTable[])
      for (const h of effects[which].values())
        await tx.execute(bound(HOUR_UPSERTS[which], hourParams(which, h, true)))
    const sign = e.kind === 'credit' ? sql`+` : sql`-`
    await tx
      .update(orgs)
      .set({ balanceNano: sql`${orgs.balanceNano} ${sign} ${e.costNano}` })
      .where(eq(orgs.id, e.orgId))
    if (e.kind === 'usage' && e.keyId) {
      const usedAt = Math.floor(e.endedAtMs / 1000)
      await tx
        .update(keys)
        .set({
          spentNano: sql`${keys.spentNano} + ${e.costNano}`,
          lastUsedAt: sql`greatest(coalesce(${keys.lastUsedAt}, 0), ${usedAt})`,
        })
        .where(eq(keys.id, e.keyId))
    }
  }

  async ledgerForOrg(orgId: string, fromMs: number, toMs: number) {
    const l = schema.ledger
    const n = schema.ledgerNotes
    const rows = await this.db
      .select({ ...getTableColumns(l), reason: n.reason })
      .from(l)
      .leftJoin(n, eq(n.requestId, l.requestId))
      .where(and(eq(l.orgId, orgId), gte(l.endedAtMs, fromMs), lt(l.endedAtMs, toMs)))
      .orderBy(asc(l.endedAtMs))
    return rows.map((r) => ({ ...r, estimated: r.estimated === 1 }))
  }

  async usageByKeyModelDay(
    orgId: string,
    fromMs: number,
    toMs: number,
    o: { readonly endUser?: string | undefined; readonly byEndUser?: boolean } = {},
  ) {
    const l = schema.ledger
    const day = sql<string>`to_char(to_timestamp(${l.endedAtMs} / 1000.0) at time zone 'UTC', 'YYYY-MM-DD')`
    const rows = await this.db
      .select({
        keyId: l.keyId,
        model: l.model,
        day,
        endUser: o.byEndUser ? l.endUser : sql<null>`NULL`,
        requests: sql<string>`count(*)`,
        promptTokens: sql<string>`sum(${l.promptTokens})`,
        completionTokens: sql<string>`sum(${l.completionTokens})`,
        costNano: sql<string>`sum(${l.costNano})`,
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
    // As in storage/sqlite/store.ts: rows admitted in the period, and rows written before the key
    // had a budget (no admission time) that started in it.
    const [admitted] = await this.db
      .select({ sum: sql<string | null>`sum(${l.costNano})` })
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
    const [before] = await this.db
      .select({ sum: sql<string | null>`sum(${l.costNano})` })
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
    return BigInt(admitted?.sum ?? 0) + BigInt(before?.sum ?? 0)
  }

  async ledgerEntry(orgId: string, requestId: string) {
    const l = schema.ledger
    const rows = await this.db
      .select()
      .from(l)
      .where(and(eq(l.requestId, requestId), eq(l.orgId, orgId)))
      .limit(1)
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
    const rows = await query
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
    return rows.map((r) => ({ ...r, estimated: r.estimated === 1 }))
  }

  async usageHours(q: UsageHoursQuery) {
    const { text, params } = usageHoursQuery(q, pgPlaceholder)
    const rows = (await this.client.unsafe(text, params)) as HourSumRow[]
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
    await this.db.insert(schema.files).values(f)
  }

  async getFile(id: string) {
    const [row] = await this.db.select().from(schema.files).where(eq(schema.files.id, id))
    return row
  }

  listFiles(orgId: string, afterId: string | undefined, limit: number) {
    const f = schema.files
    return this.db
      .select()
      .from(f)
      .where(and(eq(f.orgId, orgId), isNull(f.deletedAt), afterId ? lt(f.id, afterId) : undefined))
      .orderBy(desc(f.id))
      .limit(limit)
  }

  async markFileDeleted(id: string, atSec: number) {
    await this.db.update(schema.files).set({ deletedAt: atSec }).where(eq(schema.files.id, id))
  }

  async insertBatch(b: BatchRecord) {
    await this.db.insert(schema.batches).values(b)
  }

  async getBatch(id: string) {
    const [row] = await this.db.select().from(schema.batches).where(eq(schema.batches.id, id))
    return row as BatchRecord | undefined
  }

  async listBatches(orgId: string, afterId: string | undefined, limit: number) {
    const b = schema.batches
    return (await this.db
      .select()
      .from(b)
      .where(and(eq(b.orgId, orgId), afterId ? lt(b.id, afterId) : undefined))
      .orderBy(desc(b.id))
      .limit(limit)) as BatchRecord[]
  }

  async updateBatch(id: string, patch: BatchPatch, from?: readonly BatchStatus[]) {
    const b = schema.batches
    const rows = await this.db
      .update(b)
      .set(patch)
      .where(and(eq(b.id, id), from ? inArray(b.status, [...from]) : undefined))
      .returning({ id: b.id })
    return rows.length > 0
  }

  async claimFinalize(id: string, from: readonly BatchStatus[], patch: BatchPatch, staleAfterSec: number) {
    const b = schema.batches
    const now = sql<number>`floor(extract(epoch from clock_timestamp()))::bigint`
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
    return (await this.db
      .select()
      .from(schema.batches)
      .where(inArray(schema.batches.status, [...statuses]))) as BatchRecord[]
  }

  async enqueueLines(lines: readonly BatchLine[]) {
    await this.db.transaction(async (tx) => {
      for (let i = 0; i < lines.length; i += 500)
        await tx
          .insert(schema.batchLines)
          .values(lines.slice(i, i + 500).map((l) => ({ ...l, status: 'pending' as const })))
          .onConflictDoNothing()
    })
  }

  async leaseLines(leaseMs: number, limit: number) {
    // SKIP LOCKED: several router nodes lease from one queue without waiting on each other. The
    // time is PostgreSQL's (now(): one instant through the statement), not the node's.
    const rows = (await this.client`
      UPDATE batch_lines l SET status = 'running', lease_until_ms = (extract(epoch from now()) * 1000)::bigint + ${leaseMs}, attempts = l.attempts + 1
      FROM (
        SELECT x.batch_id, x.line FROM batch_lines x JOIN batches b ON b.id = x.batch_id
        WHERE b.status = 'in_progress'
          AND ((x.status = 'pending' AND x.not_before_ms <= (extract(epoch from now()) * 1000)::bigint) OR (x.status = 'running' AND x.lease_until_ms < (extract(epoch from now()) * 1000)::bigint))
        ORDER BY b.created_at, x.line
        LIMIT ${limit}
        FOR UPDATE OF x SKIP LOCKED
      ) s
      WHERE l.batch_id = s.batch_id AND l.line = s.line
      RETURNING l.batch_id, l.line, l.custom_id, l.body, l.attempts`) as {
      batch_id: string
      line: number
      custom_id: string
      body: string
      attempts: number
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
    const rows = await this.db
      .update(l)
      .set({ status: 'pending', leaseUntilMs: null })
      .where(eq(l.status, 'running'))
      .returning({ line: l.line })
    return rows.length
  }

  async retryLine(batchId: string, line: number, delayMs: number, notAnAttempt = false) {
    const l = schema.batchLines
    await this.db
      .update(l)
      .set({
        status: 'pending',
        notBeforeMs: sql`${sql.raw(NOW_MS)} + ${delayMs}`,
        leaseUntilMs: null,
        ...(notAnAttempt && { attempts: sql`greatest(${l.attempts} - 1, 0)` }),
      })
      .where(and(eq(l.batchId, batchId), eq(l.line, line), eq(l.status, 'running')))
  }

  async finishLine(batchId: string, line: number, ok: boolean, result: string, bill?: LedgerEntry) {
    const l = schema.batchLines
    const b = schema.batches
    return this.db.transaction(async (tx) => {
      const [row] = await tx
        .update(l)
        .set({ status: ok ? 'done' : 'failed', result, leaseUntilMs: null })
        .where(and(eq(l.batchId, batchId), eq(l.line, line), inArray(l.status, ['pending', 'running'])))
        .returning({ line: l.line })
      if (!row) return false
      if (bill) await this.writeLedgerRow(tx, bill)
      await tx
        .update(b)
        .set(ok ? { completed: sql`${b.completed} + 1` } : { failed: sql`${b.failed} + 1` })
        .where(eq(b.id, batchId))
      return true
    })
  }

  /** A page of FAIL_PAGE open lines at a time (their line numbers and custom ids, not their bodies). */
  async failOpenLines(
    batchId: string,
    result: (l: Pick<BatchLine, 'line' | 'customId'>) => string,
    onlyPending = false,
  ) {
    const l = schema.batchLines
    let n = 0
    let after = -1
    for (;;) {
      const open = await this.db
        .select({ line: l.line, customId: l.customId })
        .from(l)
        .where(
          and(
            eq(l.batchId, batchId),
            inArray(l.status, onlyPending ? ['pending'] : ['pending', 'running']),
            gt(l.line, after),
          ),
        )
        .orderBy(asc(l.line))
        .limit(FAIL_PAGE)
      for (const line of open) if (await this.finishLine(batchId, line.line, false, result(line))) n++
      if (open.length < FAIL_PAGE) return n
      after = open[open.length - 1]!.line
    }
  }

  async openLineCount(batchId: string) {
    const l = schema.batchLines
    const [row] = await this.db
      .select({ n: sql<string>`count(*)` })
      .from(l)
      .where(and(eq(l.batchId, batchId), inArray(l.status, ['pending', 'running'])))
    return Number(row?.n ?? 0)
  }

  async lineResults(batchId: string, ok: boolean) {
    const l = schema.batchLines
    const rows = await this.db
      .select({ result: l.result })
      .from(l)
      .where(and(eq(l.batchId, batchId), eq(l.status, ok ? 'done' : 'failed')))
      .orderBy(asc(l.line))
    return rows.map((r) => r.result ?? '')
  }

  async batchCostNano(batchId: string) {
    const [row] = await this.db
      .select({ sum: sql<string | null>`sum(${schema.ledger.costNano})` })
      .from(schema.ledger)
      .where(eq(schema.ledger.batchId, batchId))
    return row?.sum ? BigInt(row.sum) : 0n
  }

  async putResponse(r: ResponseRecord) {
    await this.db.insert(schema.responses).values(r)
  }

  async getResponse(orgId: string, id: string) {
    const r = schema.responses
    const [row] = await this.db
      .select()
      .from(r)
      .where(and(eq(r.id, id), eq(r.orgId, orgId)))
    return row
  }

  async deleteResponse(orgId: string, id: string) {
    const r = schema.responses
    const gone = await this.db
      .delete(r)
      .where(and(eq(r.id, id), eq(r.orgId, orgId)))
      .returning({ id: r.id })
    return gone.length > 0
  }

  async deleteResponsesBefore(createdAt: number, limit: number) {
    const r = schema.responses
    const old = this.db.select({ id: r.id }).from(r).where(lt(r.createdAt, createdAt)).limit(limit)
    const gone = await this.db.delete(r).where(inArray(r.id, old)).returning({ id: r.id })
    return gone.length
  }

  async insertConsoleSession(s: ConsoleSessionRecord) {
    await this.db.insert(schema.consoleSessions).values(s)
  }

  async getConsoleSession(id: string) {
    const c = schema.consoleSessions
    const [row] = await this.db.select().from(c).where(eq(c.id, id))
    return row
  }

  async touchConsoleSession(id: string, atSec: number) {
    const c = schema.consoleSessions
    await this.db.update(c).set({ lastSeenAt: atSec }).where(eq(c.id, id))
  }

  async deleteConsoleSession(id: string) {
    const c = schema.consoleSessions
    return (await this.db.delete(c).where(eq(c.id, id)).returning({ id: c.id })).length > 0
  }

  async deleteConsoleSessionsIdleBefore(atSec: number, limit: number) {
    const c = schema.consoleSessions
    const old = this.db.select({ id: c.id }).from(c).where(lt(c.lastSeenAt, atSec)).limit(limit)
    return (await this.db.delete(c).where(inArray(c.id, old)).returning({ id: c.id })).length
  }

  async insertWebhook(w: WebhookRecord) {
    await this.db
      .insert(schema.webhooks)
      .values({ ...w, enabled: w.enabled ? 1 : 0, balanceBelow: w.balanceBelow ? 1 : 0 })
  }

  async getWebhook(id: string) {
    const w = schema.webhooks
    const [row] = await this.db.select().from(w).where(eq(w.id, id))
    return row && webhookRow(row)
  }

  async listWebhooks(orgId?: string) {
    const w = schema.webhooks
    const q = this.db.select().from(w)
    const rows = await (orgId === undefined ? q : q.where(eq(w.orgId, orgId))).orderBy(
      asc(w.createdAt),
      asc(w.id),
    )
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
    if (Object.keys(set).length > 0) await this.db.update(w).set(set).where(eq(w.id, id))
    return this.getWebhook(id)
  }

  async deleteWebhook(id: string) {
    return this.db.transaction(async (tx) => {
      await tx.delete(schema.webhookEvents).where(eq(schema.webhookEvents.webhookId, id))
      const w = schema.webhooks
      return (await tx.delete(w).where(eq(w.id, id)).returning({ id: w.id })).length > 0
    })
  }

  async setWebhookBalanceBelow(id: string, below: boolean, event?: NewWebhookEvent) {
    const w = schema.webhooks
    return this.db.transaction(async (tx) => {
      const changed =
        (
          await tx
            .update(w)
            .set({ balanceBelow: below ? 1 : 0 })
            .where(and(eq(w.id, id), eq(w.balanceBelow, below ? 0 : 1)))
            .returning({ id: w.id })
        ).length > 0
      if (changed && event)
        await tx.insert(schema.webhookEvents).values(newEventRow(event)).onConflictDoNothing()
      return changed
    })
  }

  async enqueueWebhookEvents(events: readonly NewWebhookEvent[]) {
    if (events.length === 0) return 0
    return (
      await this.db
        .insert(schema.webhookEvents)
        .values(events.map(newEventRow))
        .onConflictDoNothing()
        .returning({ id: schema.webhookEvents.eventId })
    ).length
  }

  async claimWebhookEvents(nowMs: number, leaseMs: number, limit: number): Promise<WebhookDeliveryJob[]> {
    // SKIP LOCKED: nodes claiming at once each take other rows; the lease keeps a row with the
    // node delivering it until the attempt ends (or the node dies and the lease runs out).
    const rows = (await this.client`
      UPDATE webhook_events e SET lease_until_ms = ${nowMs + leaseMs}, attempts = e.attempts + 1
      FROM (
        SELECT x.webhook_id, x.event_id, w.url, w.secret FROM webhook_events x JOIN webhooks w ON w.id = x.webhook_id
        WHERE x.status = 'pending' AND x.next_attempt_at_ms <= ${nowMs} AND w.enabled = 1
          AND (x.lease_until_ms IS NULL OR x.lease_until_ms < ${nowMs})
        ORDER BY x.next_attempt_at_ms
        LIMIT ${limit}
        FOR UPDATE OF x SKIP LOCKED
      ) s
      WHERE e.webhook_id = s.webhook_id AND e.event_id = s.event_id
      RETURNING e.*, s.url, s.secret`) as Record<string, unknown>[]
    return rows.map((r) => ({ ...webhookEventRow(r), url: String(r.url), secret: String(r.secret) }))
  }

  async finishWebhookEvent(webhookId: string, eventId: string, a: WebhookAttempt) {
    const e = schema.webhookEvents
    await this.db
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
  }

  async releaseWebhookLeases() {
    const e = schema.webhookEvents
    return (
      await this.db
        .update(e)
        .set({ leaseUntilMs: null })
        .where(and(eq(e.status, 'pending'), sql`${e.leaseUntilMs} IS NOT NULL`))
        .returning({ id: e.eventId })
    ).length
  }

  async listWebhookEvents(webhookId: string, limit: number): Promise<WebhookEventRecord[]> {
    const rows = (await this.client`
      SELECT * FROM webhook_events WHERE webhook_id = ${webhookId}
      ORDER BY created_at_ms DESC, event_id DESC LIMIT ${limit}`) as Record<string, unknown>[]
    return rows.map(webhookEventRow)
  }

  async pruneWebhookEvents(beforeMs: number, limit: number) {
    const rows = await this.client`
      DELETE FROM webhook_events WHERE (webhook_id, event_id) IN (
        SELECT webhook_id, event_id FROM webhook_events
        WHERE status <> 'pending' AND created_at_ms < ${beforeMs} LIMIT ${limit})
      RETURNING event_id`
    return (rows as unknown[]).length
  }

  async close() {
    await this.client.close()
  }
}

/** An event as the outbox first holds it: pending, due at once. */
function newEventRow(e: NewWebhookEvent) {
  return { ...e, status: 'pending' as const, attempts: 0, nextAttemptAtMs: e.createdAtMs }
}
