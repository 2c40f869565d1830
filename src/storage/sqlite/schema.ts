import { sql } from 'drizzle-orm'
import { index, primaryKey, sqliteTable, text, uniqueIndex } from 'drizzle-orm/sqlite-core'
import type { ModelLimits } from '../records.ts'
import { budget, count, epoch, money } from './columns.ts'

export const meta = sqliteTable('meta', {
  key: text('key').primaryKey(),
  value: text('value').notNull(),
})

export const orgs = sqliteTable('orgs', {
  id: text('id').primaryKey(),
  name: text('name').notNull().unique(),
  balanceNano: money('balance_nano').notNull().default(sql`0`),
  createdAt: epoch('created_at').notNull(),
  /** The organization's requests and tokens per minute, over all its keys; null: none. */
  rpmLimit: count('rpm_limit'),
  tpmLimit: count('tpm_limit'),
  /** Per-model limits as JSON (`{"<model or pattern>": {"rpm": n, "tpm": n}}`); null: none. */
  modelLimits: text('model_limits', { mode: 'json' }).$type<ModelLimits>(),
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
    /** Unix seconds after which the key is refused (401 key_expired); null: never. */
    expiresAt: epoch('expires_at'),
    /** The model ids or patterns (`anthropic/*`) the key may use, as JSON; null: every model. */
    models: text('models', { mode: 'json' }).$type<readonly string[]>(),
    /** Requests in flight at once across the cluster; null: no bound. */
    maxConcurrency: count('max_concurrency'),
    /** A budget that resets every period (JSON); null: none. */
    budget: budget('budget'),
    /** The budget of each end user of the key, every period (JSON); null: none. */
    endUserBudget: budget('end_user_budget'),
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
    /** Prompt tokens the upstream served from its cache (null: it did not say). */
    cachedTokens: count('cached_tokens'),
    /** From the request's start to the upstream's first byte (streams) or whole body (JSON). */
    ttftMs: count('ttft_ms'),
    /** The key owner's end user the request named; null: none. */
    endUser: text('end_user'),
    /** When a request on a key with a period budget was admitted (Unix ms); null otherwise. */
    admittedAtMs: epoch('admitted_at_ms'),
    /** The receipt key a billed request was signed with (null: receipts were off); an export re-signs with it. */
    receiptKid: text('receipt_kid'),
  },
  // Usage and Activity read by organization and time, newest first (GET /v1/activity). Its
  // filters (kind, key, model, outcome) are columns of that index, so a filtered page scans index
  // entries only. An index led by the key or the model instead would be written at dozens of
  // places per flush, each a whole page in the write-ahead log: it tripled the ledger thread's
  // cost per row (bench/activity.ts, BENCHMARKS.md "Activity"); this one grows at one end per
  // organization. A batch's cost sums its rows (partial: live rows cost it nothing).
  (t) => [
    index('ledger_org_time').on(t.orgId, t.endedAtMs, t.kind, t.keyId, t.model, t.outcome),
    index('ledger_batch').on(t.batchId).where(sql`${t.batchId} IS NOT NULL`),
    // Partial, so rows without an end user (or of keys without a budget) cost no index write:
    // activity and usage filtered by end user, and a budget's spend in a period read back.
    index('ledger_end_user').on(t.orgId, t.endUser, t.endedAtMs).where(sql`${t.endUser} IS NOT NULL`),
    index('ledger_admitted').on(t.keyId, t.admittedAtMs, t.endUser).where(sql`${t.admittedAtMs} IS NOT NULL`),
  ],
)

/**
 * Why an operator credited or debited a balance: one row per credit row of the ledger that was
 * given a reason (same request id). Apart from the ledger so that its hot write stays as it is.
 */
export const ledgerNotes = sqliteTable('ledger_notes', {
  requestId: text('request_id').primaryKey(),
  reason: text('reason').notNull(),
})

/**
 * Billed usage summed per organization, key, model and UTC hour, kept by the ledger's writes
 * (the rows an INSERT actually added, one upsert per group per flush): the usage series reads
 * hours, not ledger rows. A null key or model is ''. The migration creates it WITHOUT ROWID by
 * hand (Drizzle has no such option): a series reads a range of the primary key, stored in order.
 */
export const usageHours = sqliteTable(
  'usage_hours',
  {
    orgId: text('org_id').notNull(),
    /** Unix seconds of the hour's start (UTC). */
    hourStart: epoch('hour_start').notNull(),
    keyId: text('key_id').notNull().default(''),
    model: text('model').notNull().default(''),
    requests: count('requests').notNull().default(0),
    promptTokens: count('prompt_tokens').notNull().default(0),
    completionTokens: count('completion_tokens').notNull().default(0),
    cachedTokens: count('cached_tokens').notNull().default(0),
    costNano: money('cost_nano').notNull().default(sql`0`),
  },
  (t) => [primaryKey({ columns: [t.orgId, t.hourStart, t.keyId, t.model] })],
)

/**
 * The same hours summed over every key (per model) and over every model (per key): the usage
 * series grouped by model or key (or a total) reads these, a few rows per hour, instead of one
 * per key and model. Kept by the same writes; WITHOUT ROWID, as usage_hours.
 */
export const usageHoursByModel = sqliteTable(
  'usage_hours_by_model',
  {
    orgId: text('org_id').notNull(),
    hourStart: epoch('hour_start').notNull(),
    model: text('model').notNull().default(''),
    requests: count('requests').notNull().default(0),
    promptTokens: count('prompt_tokens').notNull().default(0),
    completionTokens: count('completion_tokens').notNull().default(0),
    cachedTokens: count('cached_tokens').notNull().default(0),
    costNano: money('cost_nano').notNull().default(sql`0`),
  },
  (t) => [primaryKey({ columns: [t.orgId, t.hourStart, t.model] })],
)

export const usageHoursByKey = sqliteTable(
  'usage_hours_by_key',
  {
    orgId: text('org_id').notNull(),
    hourStart: epoch('hour_start').notNull(),
    keyId: text('key_id').notNull().default(''),
    requests: count('requests').notNull().default(0),
    promptTokens: count('prompt_tokens').notNull().default(0),
    completionTokens: count('completion_tokens').notNull().default(0),
    cachedTokens: count('cached_tokens').notNull().default(0),
    costNano: money('cost_nano').notNull().default(sql`0`),
  },
  (t) => [primaryKey({ columns: [t.orgId, t.hourStart, t.keyId] })],
)

export const files = sqliteTable(
  'files',
  {
    id: text('id').primaryKey(),
    orgId: text('org_id').notNull(),
    filename: text('filename').notNull(),
    purpose: text('purpose').notNull(),
    bytes: count('bytes').notNull(),
    lines: count('lines').notNull(),
    createdAt: epoch('created_at').notNull(),
    deletedAt: epoch('deleted_at'),
  },
  (t) => [index('files_org').on(t.orgId, t.id)],
)

export const batches = sqliteTable(
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
    /** JSON: `{ object: "list", data: [{ code, line, message, param }] }` or null. */
    errors: text('errors'),
    /** JSON object or null. */
    metadata: text('metadata'),
    total: count('total').notNull().default(sql`0`),
    completed: count('completed').notNull().default(sql`0`),
    failed: count('failed').notNull().default(sql`0`),
    costNano: money('cost_nano').notNull().default(sql`0`),
    createdAt: epoch('created_at').notNull(),
    expiresAt: epoch('expires_at').notNull(),
    inProgressAt: epoch('in_progress_at'),
    finalizingAt: epoch('finalizing_at'),
    completedAt: epoch('completed_at'),
    failedAt: epoch('failed_at'),
    expiredAt: epoch('expired_at'),
    cancellingAt: epoch('cancelling_at'),
    cancelledAt: epoch('cancelled_at'),
  },
  (t) => [index('batches_org').on(t.orgId, t.id), index('batches_status').on(t.status)],
)

/**
 * The durable queue: one row per input line. A line is `pending` until a worker leases it,
 * `running` while leased (`lease_until` lets another worker take it over after a crash), and
 * `done` or `failed` once its result is written; its result lives here until the batch is
 * finalized into output and error files, so a line is written exactly once.
 */
export const batchLines = sqliteTable(
  'batch_lines',
  {
    batchId: text('batch_id').notNull(),
    line: count('line').notNull(),
    customId: text('custom_id').notNull(),
    body: text('body').notNull(),
    status: text('status', { enum: ['pending', 'running', 'done', 'failed'] }).notNull(),
    attempts: count('attempts').notNull().default(sql`0`),
    notBeforeMs: epoch('not_before_ms').notNull().default(sql`0`),
    leaseUntilMs: epoch('lease_until_ms'),
    /** The output or error line (JSON text), once finished. */
    result: text('result'),
    costNano: money('cost_nano').notNull().default(sql`0`),
  },
  (t) => [primaryKey({ columns: [t.batchId, t.line] }), index('batch_lines_status').on(t.batchId, t.status)],
)

/** Stored Responses API responses (store: true), per organization; JSON as text. */
export const responses = sqliteTable(
  'responses',
  {
    id: text('id').primaryKey(),
    orgId: text('org_id').notNull(),
    conversation: text('conversation').notNull(),
    response: text('response').notNull(),
    createdAt: epoch('created_at').notNull(),
  },
  (t) => [index('responses_org').on(t.orgId, t.id), index('responses_created').on(t.createdAt)],
)

/**
 * Console sessions (POST /console/session): the cookie's SHA-256 only, never the cookie, and
 * never the token that signed in. `key_id` is the master key's (null: the admin token); a session
 * idle past console.session_idle_sec is refused and deleted.
 */
export const consoleSessions = sqliteTable(
  'console_sessions',
  {
    id: text('id').primaryKey(),
    kind: text('kind', { enum: ['admin', 'master'] }).notNull(),
    keyId: text('key_id'),
    csrf: text('csrf').notNull(),
    createdAt: epoch('created_at').notNull(),
    lastSeenAt: epoch('last_seen_at').notNull(),
  },
  (t) => [index('console_sessions_seen').on(t.lastSeenAt)],
)

/** Organizations' webhooks (POST /v1/webhooks); `events` is a JSON list of event types. */
export const webhooks = sqliteTable(
  'webhooks',
  {
    id: text('id').primaryKey(),
    orgId: text('org_id').notNull(),
    url: text('url').notNull(),
    /** The signing secret: kept, since every delivery is signed with it. */
    secret: text('secret').notNull(),
    events: text('events', { mode: 'json' }).$type<readonly string[]>().notNull(),
    balanceThresholdNano: money('balance_threshold_nano'),
    enabled: count('enabled').notNull().default(sql`1`),
    /** 1 once balance.below_threshold was sent; a credit above the threshold sets it back to 0. */
    balanceBelow: count('balance_below').notNull().default(sql`0`),
    createdAt: epoch('created_at').notNull(),
  },
  (t) => [index('webhooks_org').on(t.orgId, t.id)],
)

/**
 * The webhook outbox: one row per event and webhook, written before any delivery attempt (a
 * kill -9 loses none). `pending` rows are leased by a node (`lease_until_ms`) while it delivers.
 */
export const webhookEvents = sqliteTable(
  'webhook_events',
  {
    webhookId: text('webhook_id').notNull(),
    eventId: text('event_id').notNull(),
    orgId: text('org_id').notNull(),
    type: text('type').notNull(),
    payload: text('payload').notNull(),
    createdAtMs: epoch('created_at_ms').notNull(),
    status: text('status', { enum: ['pending', 'delivered', 'failed'] }).notNull(),
    attempts: count('attempts').notNull().default(sql`0`),
    nextAttemptAtMs: epoch('next_attempt_at_ms').notNull(),
    leaseUntilMs: epoch('lease_until_ms'),
    deliveredAtMs: epoch('delivered_at_ms'),
    lastError: text('last_error'),
    lastStatus: count('last_status'),
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
export const receiptKeys = sqliteTable(
  'receipt_keys',
  {
    kid: text('kid').primaryKey(),
    generation: count('generation').notNull(),
    publicKey: text('public_key').notNull(),
    privateKey: text('private_key').notNull(),
    createdAt: epoch('created_at').notNull(),
  },
  (t) => [uniqueIndex('receipt_keys_generation').on(t.generation)],
)
