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

// The same tables as storage/sqlite/schema.ts, column for column: money is bigint nano-roubles,
// times are Unix seconds or milliseconds as the column names say.
const money = (name: string) => bigint(name, { mode: 'bigint' })
const ms = (name: string) => bigint(name, { mode: 'number' })
/** A list kept as JSON text (as SQLite's text json mode does), so both stores read it alike. */
const jsonText = customType<{ data: readonly string[]; driverData: string }>({
  dataType: () => 'text',
  toDriver: (v) => JSON.stringify(v),
  fromDriver: (v) => JSON.parse(v) as readonly string[],
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
    /** The receipt key a billed request was signed with (null: receipts were off); an export re-signs with it. */
    receiptKid: text('receipt_kid'),
  },
  (t) => [
    index('ledger_org_time').on(t.orgId, t.endedAtMs, t.kind, t.keyId, t.model, t.outcome),
    index('ledger_batch').on(t.batchId).where(sql`${t.batchId} IS NOT NULL`),
  ],
)

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
