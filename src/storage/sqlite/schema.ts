import { sql } from 'drizzle-orm'
import { index, sqliteTable, text, uniqueIndex } from 'drizzle-orm/sqlite-core'
import { count, epoch, money } from './columns.ts'

export const meta = sqliteTable('meta', {
  key: text('key').primaryKey(),
  value: text('value').notNull(),
})

export const orgs = sqliteTable('orgs', {
  id: text('id').primaryKey(),
  name: text('name').notNull().unique(),
  balanceNano: money('balance_nano').notNull().default(sql`0`),
  createdAt: epoch('created_at').notNull(),
})

export const keys = sqliteTable(
  'keys',
  {
    id: text('id').primaryKey(),
    orgId: text('org_id')
      .notNull()
      .references(() => orgs.id),
    kind: text('kind', { enum: ['api', 'master'] }).notNull(),
    name: text('name').notNull(),
    secretHash: text('secret_hash').notNull(),
    hint: text('hint').notNull(),
    limitNano: money('limit_nano'),
    spentNano: money('spent_nano').notNull().default(sql`0`),
    status: text('status', { enum: ['active', 'disabled', 'revoked'] }).notNull(),
    createdAt: epoch('created_at').notNull(),
    lastUsedAt: epoch('last_used_at'),
    revokedAt: epoch('revoked_at'),
    rpmLimit: count('rpm_limit'),
    tpmLimit: count('tpm_limit'),
  },
  (t) => [uniqueIndex('keys_secret_hash').on(t.secretHash), index('keys_org').on(t.orgId, t.kind, t.id)],
)

export const ledger = sqliteTable(
  'ledger',
  {
    requestId: text('request_id').primaryKey(),
    kind: text('kind', { enum: ['usage', 'credit'] }).notNull(),
    orgId: text('org_id').notNull(),
    keyId: text('key_id'),
    model: text('model'),
    node: text('node'),
    promptTokens: count('prompt_tokens').notNull().default(0),
    completionTokens: count('completion_tokens').notNull().default(0),
    costNano: money('cost_nano').notNull(),
    batchId: text('batch_id'),
    startedAtMs: epoch('started_at_ms').notNull(),
    endedAtMs: epoch('ended_at_ms').notNull(),
    outcome: text('outcome').notNull(),
    estimated: count('estimated').notNull().default(0),
  },
  (t) => [index('ledger_org_time').on(t.orgId, t.endedAtMs), index('ledger_key').on(t.keyId)],
)
