import { sql } from 'drizzle-orm'
import {
  bigint,
  customType,
  index,
  integer,
  pgTable,
  primaryKey,
  text,
  uniqueIndex,
} from 'drizzle-orm/pg-core'
import type { Budget } from '../../billing/budgets.ts'
import { budgetFromText, budgetToText, type ModelLimits } from '../records.ts'

// The same tables as storage/sqlite/schema.ts, column for column: money is bigint nano-roubles,
// times are Unix seconds or milliseconds as the column names say.
const money = (name: string) => bigint(name, { mode: 'bigint' })
const ms = (name: string) => bigint(name, { mode: 'number' })
/** A list kept as JSON text (as SQLite's text json mode does), so both stores read it alike. */
/** A period budget as JSON text (the amount a decimal string), as SQLite keeps it. */
const budgetText = customType<{ data: Budget; driverData: string }>({
  dataType: () => 'text',
  toDriver: budgetToText,
  fromDriver: budgetFromText,
})
const jsonText = customType<{ data: readonly string[]; driverData: string }>({
  dataType: () => 'text',
  toDriver: (v) => JSON.stringify(v),
  fromDriver: (v) => JSON.parse(v) as readonly string[],
})
/** An organization's per-model limits, as JSON text too. */
const modelLimitsText = customType<{ data: ModelLimits; driverData: string }>({
  dataType: () => 'text',
  toDriver: (v) => JSON.stringify(v),
  fromDriver: (v) => JSON.parse(v) as ModelLimits,
})

export const meta = pgTable('meta', {
  key: text('key').primaryKey(),
  value: text('value').notNull(),
})

export const orgs = pgTable('orgs', {
  id: text('id').primaryKey(),
  name: text('name').notNull().unique(),
  balanceNano: money('balance_nano').notNull().default(sql`0`),
  createdAt: integer('created_at').notNull(),
  rpmLimit: integer('rpm_limit'),
  tpmLimit: integer('tpm_limit'),
  modelLimits: modelLimitsText('model_limits'),
})

export const keys = pgTable(
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
    createdAt: integer('created_at').notNull(),
    lastUsedAt: integer('last_used_at'),
    revokedAt: integer('revoked_at'),
    rpmLimit: integer('rpm_limit'),
    tpmLimit: integer('tpm_limit'),
    expiresAt: integer('expires_at'),
    models: jsonText('models'),
    maxConcurrency: integer('max_concurrency'),
    budget: budgetText('budget'),
    endUserBudget: budgetText('end_user_budget'),
  },
  (t) => [uniqueIndex('keys_secret_hash').on(t.secretHash), index('keys_org').on(t.orgId, t.kind, t.id)],
)

export const ledger = pgTable(
  'ledger',
  {
    requestId: text('request_id').primaryKey(),
    kind: text('kind', { enum: ['usage', 'credit'] }).notNull(),
    orgId: text('org_id').notNull(),
    keyId: text('key_id'),
    model: text('model'),
    node: text('node'),
    promptTokens: integer('prompt_tokens').notNull().default(0),
    completionTokens: integer('completion_tokens').notNull().default(0),
    costNano: money('cost_nano').notNull(),
    batchId: text('batch_id'),
    startedAtMs: ms('started_at_ms').notNull(),
    endedAtMs: ms('ended_at_ms').notNull(),
    outcome: text('outcome').notNull(),
    estimated: integer('estimated').notNull().default(0),
    cachedTokens: integer('cached_tokens'),
    ttftMs: integer('ttft_ms'),
    endUser: text('end_user'),
    admittedAtMs: ms('admitted_at_ms'),
    /** The receipt key a billed request was signed with (null: receipts were off); an export re-signs with it. */
    receiptKid: text('receipt_kid'),
  },
  (t) => [
    index('ledger_org_time').on(t.orgId, t.endedAtMs, t.kind, t.keyId, t.model, t.outcome),
    index('ledger_batch').on(t.batchId).where(sql`${t.batchId} IS NOT NULL`),
    index('ledger_end_user').on(t.orgId, t.endUser, t.endedAtMs).where(sql`${t.endUser} IS NOT NULL`),
    index('ledger_admitted').on(t.keyId, t.admittedAtMs, t.endUser).where(sql`${t.admittedAtMs} IS NOT NULL`),
  ],
)

/** As in storage/sqlite/schema.ts: the reason given for a credit or debit. */
export const ledgerNotes = pgTable('ledger_notes', {
  requestId: text('request_id').primaryKey(),
  reason: text('reason').notNull(),
})

/** As in storage/sqlite/schema.ts: billed usage per organization, key, model and UTC hour. */
export const usageHours = pgTable(
  'usage_hours',
  {
    orgId: text('org_id').notNull(),
    hourStart: bigint('hour_start', { mode: 'number' }).notNull(),
    keyId: text('key_id').notNull().default(''),
    model: text('model').notNull().default(''),
    requests: bigint('requests', { mode: 'number' }).notNull().default(0),
    promptTokens: bigint('prompt_tokens', { mode: 'number' }).notNull().default(0),
    completionTokens: bigint('completion_tokens', { mode: 'number' }).notNull().default(0),
    cachedTokens: bigint('cached_tokens', { mode: 'number' }).notNull().default(0),
    costNano: money('cost_nano').notNull().default(sql`0`),
  },
  (t) => [primaryKey({ columns: [t.orgId, t.hourStart, t.keyId, t.model] })],
)

/** As in storage/sqlite/schema.ts: the hours summed per model and per key. */
export const usageHoursByModel = pgTable(
  'usage_hours_by_model',
  {
    orgId: text('org_id').notNull(),
    hourStart: bigint('hour_start', { mode: 'number' }).notNull(),
    model: text('model').notNull().default(''),
    requests: bigint('requests', { mode: 'number' }).notNull().default(0),
    promptTokens: bigint('prompt_tokens', { mode: 'number' }).notNull().default(0),
    completionTokens: bigint('completion_tokens', { mode: 'number' }).notNull().default(0),
    cachedTokens: bigint('cached_tokens', { mode: 'number' }).notNull().default(0),
    costNano: money('cost_nano').notNull().default(sql`0`),
  },
  (t) => [primaryKey({ columns: [t.orgId, t.hourStart, t.model] })],
)

export const usageHoursByKey = pgTable(
  'usage_hours_by_key',
  {
    orgId: text('org_id').notNull(),
    hourStart: bigint('hour_start', { mode: 'number' }).notNull(),
    keyId: text('key_id').notNull().default(''),
    requests: bigint('requests', { mode: 'number' }).notNull().default(0),
    promptTokens: bigint('prompt_tokens', { mode: 'number' }).notNull().default(0),
    completionTokens: bigint('completion_tokens', { mode: 'number' }).notNull().default(0),
    cachedTokens: bigint('cached_tokens', { mode: 'number' }).notNull().default(0),
    costNano: money('cost_nano').notNull().default(sql`0`),
  },
  (t) => [primaryKey({ columns: [t.orgId, t.hourStart, t.keyId] })],
)

export const files = pgTable(
  'files',
  {
    id: text('id').primaryKey(),
    orgId: text('org_id').notNull(),
    filename: text('filename').notNull(),
    purpose: text('purpose').notNull(),
    bytes: bigint('bytes', { mode: 'number' }).notNull(),
    lines: integer('lines').notNull(),
    createdAt: integer('created_at').notNull(),
    deletedAt: integer('deleted_at'),
  },
  (t) => [index('files_org').on(t.orgId, t.id)],
)

export const batches = pgTable(
  'batches',
  {
    id: text('id').primaryKey(),
    orgId: text('org_id').notNull(),
    keyId: text('key_id').notNull(),
    endpoint: text('endpoint').notNull(),
    inputFileId: text('input_file_id').notNull(),
    completionWindow: text('completion_window').notNull(),
    status: text('status').notNull(),
    outputFileId: text('output_file_id'),
    errorFileId: text('error_file_id'),
    errors: text('errors'),
    metadata: text('metadata'),
    total: integer('total').notNull().default(0),
    completed: integer('completed').notNull().default(0),
    failed: integer('failed').notNull().default(0),
    costNano: money('cost_nano').notNull().default(sql`0`),
    createdAt: integer('created_at').notNull(),
    expiresAt: integer('expires_at').notNull(),
    inProgressAt: integer('in_progress_at'),
    finalizingAt: integer('finalizing_at'),
    completedAt: integer('completed_at'),
    failedAt: integer('failed_at'),
    expiredAt: integer('expired_at'),
    cancellingAt: integer('cancelling_at'),
    cancelledAt: integer('cancelled_at'),
  },
  (t) => [index('batches_org').on(t.orgId, t.id), index('batches_status').on(t.status)],
)

export const batchLines = pgTable(
  'batch_lines',
  {
    batchId: text('batch_id').notNull(),
    line: integer('line').notNull(),
    customId: text('custom_id').notNull(),
    body: text('body').notNull(),
    status: text('status', { enum: ['pending', 'running', 'done', 'failed'] }).notNull(),
    attempts: integer('attempts').notNull().default(0),
    notBeforeMs: ms('not_before_ms').notNull().default(0),
    leaseUntilMs: ms('lease_until_ms'),
    result: text('result'),
    costNano: money('cost_nano').notNull().default(sql`0`),
  },
  (t) => [primaryKey({ columns: [t.batchId, t.line] }), index('batch_lines_status').on(t.batchId, t.status)],
)

export const responses = pgTable(
  'responses',
  {
    id: text('id').primaryKey(),
    orgId: text('org_id').notNull(),
    conversation: text('conversation').notNull(),
    response: text('response').notNull(),
    createdAt: integer('created_at').notNull(),
  },
  (t) => [index('responses_org').on(t.orgId, t.id), index('responses_created').on(t.createdAt)],
)

export const consoleSessions = pgTable(
  'console_sessions',
  {
    id: text('id').primaryKey(),
    kind: text('kind', { enum: ['admin', 'master'] }).notNull(),
    keyId: text('key_id'),
    csrf: text('csrf').notNull(),
    createdAt: integer('created_at').notNull(),
    lastSeenAt: integer('last_seen_at').notNull(),
  },
  (t) => [index('console_sessions_seen').on(t.lastSeenAt)],
)

export const webhooks = pgTable(
  'webhooks',
  {
    id: text('id').primaryKey(),
    orgId: text('org_id').notNull(),
    url: text('url').notNull(),
    secret: text('secret').notNull(),
    events: jsonText('events').notNull(),
    balanceThresholdNano: money('balance_threshold_nano'),
    enabled: integer('enabled').notNull().default(1),
    balanceBelow: integer('balance_below').notNull().default(0),
    createdAt: integer('created_at').notNull(),
  },
  (t) => [index('webhooks_org').on(t.orgId, t.id)],
)

export const webhookEvents = pgTable(
  'webhook_events',
  {
    webhookId: text('webhook_id').notNull(),
    eventId: text('event_id').notNull(),
    orgId: text('org_id').notNull(),
    type: text('type').notNull(),
    payload: text('payload').notNull(),
    createdAtMs: ms('created_at_ms').notNull(),
    status: text('status', { enum: ['pending', 'delivered', 'failed'] }).notNull(),
    attempts: integer('attempts').notNull().default(0),
    nextAttemptAtMs: ms('next_attempt_at_ms').notNull(),
    leaseUntilMs: ms('lease_until_ms'),
    deliveredAtMs: ms('delivered_at_ms'),
    lastError: text('last_error'),
    lastStatus: integer('last_status'),
  },
  (t) => [
    primaryKey({ columns: [t.webhookId, t.eventId] }),
    index('webhook_events_due').on(t.status, t.nextAttemptAtMs),
    index('webhook_events_created').on(t.webhookId, t.createdAtMs),
  ],
)

/**
 * Receipt signing keys (docs/api.md, "Receipts"): Ed25519, one row per key, the newest generation
 * signs. `public_key` is the raw 32 bytes in base64url; `private_key` the PKCS #8 key encrypted
 * with AES-256-GCM under a key derived from server.secret. Rows are never deleted: exports re-sign
 * old rows with the key that signed them, and the public keys stay published.
 */
export const receiptKeys = pgTable(
  'receipt_keys',
  {
    kid: text('kid').primaryKey(),
    generation: integer('generation').notNull(),
    publicKey: text('public_key').notNull(),
    privateKey: text('private_key').notNull(),
    createdAt: integer('created_at').notNull(),
  },
  (t) => [uniqueIndex('receipt_keys_generation').on(t.generation)],
)
