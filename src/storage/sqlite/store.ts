import { Database } from 'bun:sqlite'
import { mkdirSync } from 'node:fs'
import { dirname } from 'node:path'
import { and, asc, eq, gt, gte, lt, sql } from 'drizzle-orm'
import { type BunSQLiteDatabase, drizzle } from 'drizzle-orm/bun-sqlite'
import type { KeyListQuery, KeyPatch, KeyRecord, LedgerEntry, OrgRecord, Store } from '../store.ts'
import { embeddedMigrations } from './migrations.ts'
import * as schema from './schema.ts'

type Db = BunSQLiteDatabase<typeof schema>

/** Opens (creating if needed) a SQLite file in WAL mode and applies the embedded migrations. */
export function openSqliteStore(path: string): SqliteStore {
  if (path !== ':memory:') mkdirSync(dirname(path), { recursive: true })
  const client = new Database(path, { create: true, safeIntegers: true, strict: true })
  client.run('PRAGMA journal_mode = WAL')
  // NORMAL is durable against a process kill (the WAL is in the OS cache); only a power loss can
  // lose the last commits, which the crash-safety guarantee in docs/ does not cover.
  client.run('PRAGMA synchronous = NORMAL')
  client.run('PRAGMA busy_timeout = 5000')
  client.run('PRAGMA foreign_keys = ON')
  const db = drizzle({ client, schema })
  // Drizzle's migrator reads a folder; inside the executable the SQL is embedded, so hand the
  // same records to the dialect directly.
  const internals = db as unknown as {
    dialect: { migrate(m: unknown, s: unknown, c: unknown): void }
    session: unknown
  }
  internals.dialect.migrate(embeddedMigrations(), internals.session, { migrationsFolder: '(embedded)' })
  return new SqliteStore(client, db)
}

export class SqliteStore implements Store {
  constructor(
    private readonly client: Database,
    private readonly db: Db,
  ) {}

  async getMeta(key: string) {
    return this.db.select().from(schema.meta).where(eq(schema.meta.key, key)).get()?.value
  }

  async initMeta(key: string, value: string) {
    this.db.insert(schema.meta).values({ key, value }).onConflictDoNothing().run()
    return (await this.getMeta(key))!
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

  async insertKey(key: KeyRecord) {
    this.db.insert(schema.keys).values(key).run()
  }

  async getKey(id: string) {
    return this.db.select().from(schema.keys).where(eq(schema.keys.id, id)).get()
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

  async recordLedger(entries: readonly LedgerEntry[]) {
    if (entries.length === 0) return
    const { keys, orgs, ledger } = schema
    this.db.transaction((tx) => {
      for (const e of entries) {
        const inserted = tx
          .insert(ledger)
          .values({ ...e, estimated: e.estimated ? 1 : 0 })
          .onConflictDoNothing()
          .returning({ id: ledger.requestId })
          .get()
        if (inserted === undefined) continue // already billed: a replay after a crash
        if (e.kind === 'credit') {
          tx.update(orgs)
            .set({ balanceNano: sql`${orgs.balanceNano} + ${e.costNano}` })
            .where(eq(orgs.id, e.orgId))
            .run()
          continue
        }
        tx.update(orgs)
          .set({ balanceNano: sql`${orgs.balanceNano} - ${e.costNano}` })
          .where(eq(orgs.id, e.orgId))
          .run()
        if (e.keyId) {
          const usedAt = Math.floor(e.endedAtMs / 1000)
          tx.update(keys)
            .set({
              spentNano: sql`${keys.spentNano} + ${e.costNano}`,
              lastUsedAt: sql`max(coalesce(${keys.lastUsedAt}, 0), ${usedAt})`,
            })
            .where(eq(keys.id, e.keyId))
            .run()
        }
      }
    })
  }

  async ledgerForOrg(orgId: string, fromMs: number, toMs: number) {
    const l = schema.ledger
    const rows = this.db
      .select()
      .from(l)
      .where(and(eq(l.orgId, orgId), gte(l.endedAtMs, fromMs), lt(l.endedAtMs, toMs)))
      .orderBy(asc(l.endedAtMs))
      .all()
    return rows.map((r) => ({ ...r, estimated: r.estimated === 1 }))
  }

  async usageByKeyModelDay(orgId: string, fromMs: number, toMs: number) {
    const l = schema.ledger
    const day = sql<string>`strftime('%Y-%m-%d', ${l.endedAtMs} / 1000, 'unixepoch')`
    const rows = this.db
      .select({
        keyId: l.keyId,
        model: l.model,
        day,
        requests: sql<bigint>`count(*)`,
        promptTokens: sql<bigint>`sum(${l.promptTokens})`,
        completionTokens: sql<bigint>`sum(${l.completionTokens})`,
        costNano: sql<bigint>`sum(${l.costNano})`,
      })
      .from(l)
      .where(and(eq(l.orgId, orgId), eq(l.kind, 'usage'), gte(l.endedAtMs, fromMs), lt(l.endedAtMs, toMs)))
      .groupBy(l.keyId, l.model, day)
      .orderBy(day, l.keyId, l.model)
      .all()
    return rows.map((r) => ({
      ...r,
      requests: Number(r.requests),
      promptTokens: Number(r.promptTokens),
      completionTokens: Number(r.completionTokens),
      costNano: BigInt(r.costNano),
    }))
  }

  async close() {
    this.client.close()
  }
}
