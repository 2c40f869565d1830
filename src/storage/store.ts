import type { Budget } from '../billing/budgets.ts'
import type { NanoRub } from '../billing/money.ts'
import type { LedgerRows } from './ledger-rows.ts'
import type { LedgerEntry, ModelLimits } from './records.ts'

export type KeyKind = 'api' | 'master'
export type KeyStatus = 'active' | 'disabled' | 'revoked'

export interface OrgRecord {
  readonly id: string
  readonly name: string
  readonly balanceNano: NanoRub
  readonly createdAt: number
  /** Requests per minute over all the organization's keys; null or absent: none. */
  readonly rpmLimit?: number | null
  /** Tokens per minute over all the organization's keys; null or absent: none. */
  readonly tpmLimit?: number | null
  /** Requests and tokens per minute per model (id or pattern); null or absent: none. */
  readonly modelLimits?: ModelLimits | null
}

export type OrgPatch = Partial<Pick<OrgRecord, 'rpmLimit' | 'tpmLimit' | 'modelLimits'>>

export interface KeyRecord {
  readonly id: string
  readonly orgId: string
  readonly kind: KeyKind
  readonly name: string
  /** SHA-256 hex of the secret; the secret itself is never stored. */
  readonly secretHash: string
  /** `sk-…abcd`, shown in lists instead of the secret. */
  readonly hint: string
  /** null: no key limit, only the organization balance. */
  readonly limitNano: NanoRub | null
  readonly spentNano: NanoRub
  readonly status: KeyStatus
  readonly createdAt: number
  readonly lastUsedAt: number | null
  readonly revokedAt: number | null
  readonly rpmLimit: number | null
  readonly tpmLimit: number | null
  /** Unix seconds after which the key is refused; null: never. */
  readonly expiresAt: number | null
  /** Model ids or patterns (`anthropic/*`) the key may use; null: every model. */
  readonly models: readonly string[] | null
  /** Requests in flight at once across the cluster; null: no bound. */
  readonly maxConcurrency: number | null
  /** A budget that resets every period; null: none. */
  readonly budget: Budget | null
  /** The budget each end user of the key gets, every period; null: none. */
  readonly endUserBudget: Budget | null
}

export type KeyPatch = Partial<
  Pick<
    KeyRecord,
    | 'name'
    | 'limitNano'
    | 'status'
    | 'revokedAt'
    | 'rpmLimit'
    | 'tpmLimit'
    | 'expiresAt'
    | 'models'
    | 'maxConcurrency'
    | 'budget'
    | 'endUserBudget'
  >
>

export type { LedgerEntry, ModelLimits }

/** Usage of one key on one model on one UTC day (and one end user, when grouped by end user). */
export interface UsageRow {
  readonly keyId: string | null
  readonly model: string | null
  /** Present when the query grouped by end user (null: requests that named none). */
  readonly endUser?: string | null
  /** UTC date, YYYY-MM-DD. */
  readonly day: string
  readonly requests: number
  readonly promptTokens: number
  readonly completionTokens: number
  readonly costNano: NanoRub
}

/** GET /v1/activity: ledger rows of one organization, newest first, in (endedAtMs, requestId) order. */
export interface ActivityQuery {
  readonly orgId: string
  readonly keyId?: string | undefined
  readonly model?: string | undefined
  readonly outcome?: string | undefined
  /** Rows of requests that named this end user. */
  readonly endUser?: string | undefined
  /** ended_at_ms in [fromMs, toMs). */
  readonly fromMs?: number | undefined
  readonly toMs?: number | undefined
  /** Credits too (kind 'credit'); billed requests only otherwise. */
  readonly includeCredits?: boolean | undefined
  /** Only rows after this one in the order (older, or as old with a smaller request id): the cursor. */
  readonly before?: { readonly endedAtMs: number; readonly requestId: string } | undefined
  readonly limit: number
}

/** The usage series: hours of usage_hours in [fromSec, toSec), summed per hour and group. */
export interface UsageHoursQuery {
  readonly orgId: string
  readonly fromSec: number
  readonly toSec: number
  readonly keyId?: string | undefined
  readonly model?: string | undefined
  /** Sum per hour and per key or model; null: per hour only. */
  readonly groupBy: 'model' | 'key' | null
}

/** One hour's billed usage (of one group). */
export interface UsageHourSum {
  /** Unix seconds of the hour's start (UTC). */
  readonly hourStart: number
  /** The key id or model (null when not grouped, or the rows had none). */
  readonly group: string | null
  readonly requests: number
  readonly promptTokens: number
  readonly completionTokens: number
  readonly cachedTokens: number
  readonly costNano: NanoRub
}

export interface FileRecord {
  readonly id: string
  readonly orgId: string
  readonly filename: string
  readonly purpose: string
  readonly bytes: number
  readonly lines: number
  readonly createdAt: number
  readonly deletedAt: number | null
}

export type BatchStatus =
  | 'validating'
  | 'failed'
  | 'in_progress'
  | 'finalizing'
  | 'completed'
  | 'expired'
  | 'cancelling'
  | 'cancelled'

export interface BatchRecord {
  readonly id: string
  readonly orgId: string
  readonly keyId: string
  readonly endpoint: string
  readonly inputFileId: string
  readonly completionWindow: string
  readonly status: BatchStatus
  readonly outputFileId: string | null
  readonly errorFileId: string | null
  /** JSON text of OpenAI's `errors` object, or null. */
  readonly errors: string | null
  /** JSON text of the caller's metadata, or null. */
  readonly metadata: string | null
  readonly total: number
  readonly completed: number
  readonly failed: number
  readonly costNano: NanoRub
  readonly createdAt: number
  readonly expiresAt: number
  readonly inProgressAt: number | null
  readonly finalizingAt: number | null
  readonly completedAt: number | null
  readonly failedAt: number | null
  readonly expiredAt: number | null
  readonly cancellingAt: number | null
  readonly cancelledAt: number | null
}

export type BatchPatch = Partial<
  Omit<BatchRecord, 'id' | 'orgId' | 'keyId' | 'endpoint' | 'inputFileId' | 'createdAt'>
>

/** One input line of a batch in the durable queue. */
export interface BatchLine {
  readonly batchId: string
  readonly line: number
  readonly customId: string
  readonly body: string
  readonly attempts: number
}

/** A stored Responses API response (POST /v1/responses with store: true). */
export interface ResponseRecord {
  readonly id: string
  readonly orgId: string
  /**
   * JSON array of Responses input items: the conversation a follow-up continues from (the
   * previous response's conversation, this request's input, this response's output; the
   * instructions are not carried over, as in OpenAI's API).
   */
  readonly conversation: string
  /** JSON text of the Response object as it was returned. */
  readonly response: string
  readonly createdAt: number
}

/** A console sign-in (POST /console/session), kept in the store so every node of a cluster knows it. */
export interface ConsoleSessionRecord {
  /** SHA-256 hex of the session cookie's value. */
  readonly id: string
  readonly kind: 'admin' | 'master'
  /** The master key that signed in; null for the admin token. */
  readonly keyId: string | null
  /** The value state-changing console calls must echo in x-csrf-token. */
  readonly csrf: string
  readonly createdAt: number
  /** Unix seconds of the session's last use (refreshed at most once a minute). */
  readonly lastSeenAt: number
}

/** A receipt signing key (docs/api.md, "Receipts"). */
export interface ReceiptKeyRecord {
  readonly kid: string
  /** 1 for the first key; the highest signs. Unique, so two nodes rotating at once make one key. */
  readonly generation: number
  /** The raw Ed25519 public key, base64url. */
  readonly publicKey: string
  /** The PKCS #8 private key, encrypted (billing/receipt-keys.ts sealKey). */
  readonly privateKey: string
  readonly createdAt: number
}

export interface KeyListQuery {
  readonly orgId: string
  readonly kind: KeyKind
  readonly status?: KeyStatus | undefined
  readonly afterId?: string | undefined
  readonly limit: number
}

/** An organization's webhook (POST /v1/webhooks). */
export interface WebhookRecord {
  readonly id: string
  readonly orgId: string
  readonly url: string
  /** The signing secret (whsec_...): kept, since every delivery is signed with it. */
  readonly secret: string
  /** Event types the webhook receives. */
  readonly events: readonly string[]
  /** balance.below_threshold fires when the balance drops below this; null: never. */
  readonly balanceThresholdNano: NanoRub | null
  readonly enabled: boolean
  /** The balance is below the threshold and the event was sent; a credit above it re-arms. */
  readonly balanceBelow: boolean
  readonly createdAt: number
}

export type WebhookPatch = Partial<
  Pick<WebhookRecord, 'url' | 'events' | 'balanceThresholdNano' | 'enabled' | 'balanceBelow'>
>

/** An event to deliver to one webhook, as written to the outbox. */
export interface NewWebhookEvent {
  readonly webhookId: string
  /** The idempotency id the receiver sees (tropa-event-id); unique per webhook. */
  readonly eventId: string
  readonly orgId: string
  readonly type: string
  /** The body sent, JSON text, fixed once written (each attempt signs the same bytes). */
  readonly payload: string
  readonly createdAtMs: number
}

export type WebhookEventStatus = 'pending' | 'delivered' | 'failed'

/** A row of the webhook outbox. */
export interface WebhookEventRecord extends NewWebhookEvent {
  readonly status: WebhookEventStatus
  /** Attempts made (a claim counts one). */
  readonly attempts: number
  readonly nextAttemptAtMs: number
  readonly deliveredAtMs: number | null
  readonly lastError: string | null
  /** The receiver's last HTTP status; null: no answer. */
  readonly lastStatus: number | null
}

/** A claimed outbox row with what its delivery needs. */
export interface WebhookDeliveryJob extends WebhookEventRecord {
  readonly url: string
  readonly secret: string
}

/** How a delivery attempt ended: delivered, to be tried again at a time, or given up. */
export type WebhookAttempt =
  | { readonly status: 'delivered'; readonly atMs: number; readonly httpStatus: number }
  | {
      readonly status: 'pending' | 'failed'
      readonly nextAttemptAtMs: number
      readonly error: string
      readonly httpStatus: number | null
    }

/** The only storage type services see. SQLite (embedded) and PostgreSQL implement it. */
export interface Store {
  getMeta(key: string): Promise<string | undefined>
  /** Sets the value only if the key is absent; returns the value now stored. */
  initMeta(key: string, value: string): Promise<string>

  insertOrg(org: OrgRecord): Promise<void>
  getOrg(id: string): Promise<OrgRecord | undefined>
  findOrgByName(name: string): Promise<OrgRecord | undefined>
  /** Changes an organization's rate limits; the record after, or undefined when there is none. */
  updateOrg(id: string, patch: OrgPatch): Promise<OrgRecord | undefined>

  insertKey(key: KeyRecord): Promise<void>
  getKey(id: string): Promise<KeyRecord | undefined>
  getKeyByHash(secretHash: string): Promise<KeyRecord | undefined>
  listKeys(q: KeyListQuery): Promise<KeyRecord[]>
  updateKey(id: string, patch: KeyPatch): Promise<KeyRecord | undefined>
  /** Every key, revoked ones included (so they answer key_revoked), to warm the in-memory cache. */
  loadKeys(): Promise<KeyRecord[]>
  loadOrgs(): Promise<OrgRecord[]>

  /**
   * Applies ledger entries in one transaction: inserts the rows and moves each key's spent,
   * last use and its organization's balance with them. A request id already in the ledger is
   * skipped, so replaying a batch never bills twice.
   */
  recordLedger(entries: readonly LedgerEntry[]): Promise<void>
  /** The same for a ledger writer's flush, bound from its columns (no object per row). */
  recordLedgerRows(rows: LedgerRows): Promise<void>
  ledgerForOrg(orgId: string, fromMs: number, toMs: number): Promise<LedgerEntry[]>
  /**
   * Billed usage (credits excluded) grouped by key, model and UTC day, ordered by day; with
   * `byEndUser` by end user too, and with `endUser` only that end user's requests.
   */
  usageByKeyModelDay(
    orgId: string,
    fromMs: number,
    toMs: number,
    o?: { readonly endUser?: string | undefined; readonly byEndUser?: boolean },
  ): Promise<UsageRow[]>
  /**
   * What a key (or one of its end users) was charged for requests admitted in [fromMs, toMs): rows
   * with `admitted_at_ms` in it, and rows written without one (before the key had a budget)
   * started in it. A period budget's spend, read back when a node has no counter of it.
   */
  periodSpend(q: {
    readonly orgId: string
    readonly keyId: string
    readonly endUser: string | null
    readonly fromMs: number
    readonly toMs: number
  }): Promise<NanoRub>
  /** One ledger row of this organization; undefined when absent or another organization's. */
  ledgerEntry(orgId: string, requestId: string): Promise<LedgerEntry | undefined>
  /** Ledger rows newest first (by ended time, then request id, both descending), filtered; indexed. */
  listActivity(q: ActivityQuery): Promise<LedgerEntry[]>
  /** Billed usage per UTC hour (and key or model), ordered by hour: from usage_hours, not the ledger. */
  usageHours(q: UsageHoursQuery): Promise<UsageHourSum[]>

  insertFile(f: FileRecord): Promise<void>
  getFile(id: string): Promise<FileRecord | undefined>
  listFiles(orgId: string, afterId: string | undefined, limit: number): Promise<FileRecord[]>
  markFileDeleted(id: string, atSec: number): Promise<void>

  insertBatch(b: BatchRecord): Promise<void>
  getBatch(id: string): Promise<BatchRecord | undefined>
  listBatches(orgId: string, afterId: string | undefined, limit: number): Promise<BatchRecord[]>
  /** Updates a batch only if it is in one of `from` (when given); returns whether it did. */
  updateBatch(id: string, patch: BatchPatch, from?: readonly BatchStatus[]): Promise<boolean>
  /**
   * Claims a batch's finalization for the caller (one node of several): applies `patch` and
   * stamps `finalizingAt` with the store's own clock, only if the batch is in one of `from` and
   * no claim was stamped in the last `staleAfterSec` seconds by that same clock (so the nodes'
   * clocks do not matter). Returns the stamp; only the caller that gets one writes the result
   * files. Undefined: another caller holds the claim, or the batch is in no status of `from`.
   */
  claimFinalize(
    id: string,
    from: readonly BatchStatus[],
    patch: BatchPatch,
    staleAfterSec: number,
  ): Promise<number | undefined>
  /** Gives back the claim stamped `stampedAt`, if it is still that one and the batch in `from`. */
  releaseFinalize(id: string, from: readonly BatchStatus[], stampedAt: number): Promise<void>
  batchesInStatus(statuses: readonly BatchStatus[]): Promise<BatchRecord[]>
  /** Adds the validated lines of a batch to the queue (all pending); lines already there are kept (validating twice is harmless). */
  enqueueLines(lines: readonly BatchLine[]): Promise<void>
  /**
   * Leases up to `limit` runnable lines of in-progress batches for `leaseMs`: pending ones whose
   * back-off is over, and running ones whose lease expired (their worker died). Atomic: two
   * workers never lease the same line. Leases and back-offs are timed by the store's clock, so
   * nodes whose clocks disagree still agree on when a lease has expired.
   */
  leaseLines(leaseMs: number, limit: number): Promise<BatchLine[]>
  /**
   * Returns every leased line to the queue. Only for a store that one router node owns (SQLite),
   * at start: its leases can only belong to workers of a process that died.
   */
  releaseAllLeases(): Promise<number>
  /**
   * Returns a leased line to the queue, to be retried `delayMs` from now (the store's clock).
   * `notAnAttempt`: the line never reached an upstream (no node had room), so its lease does not
   * count as an attempt.
   */
  retryLine(batchId: string, line: number, delayMs: number, notAnAttempt?: boolean): Promise<void>
  /** Writes a line's final result once and counts it in its batch; false if it was already final. */
  finishLine(
    batchId: string,
    line: number,
    ok: boolean,
    result: string,
    /** The line's ledger row, written in the same transaction: a kill cannot leave a finished line unbilled. */
    bill?: LedgerEntry,
  ): Promise<boolean>
  /**
   * Fails the unfinished lines of a batch (only the pending ones if asked) with this result, and
   * counts them in the batch. A batch may have many thousands: the work is done in bounded chunks,
   * and the caller's event loop runs between them.
   */
  failOpenLines(
    batchId: string,
    result: (l: Pick<BatchLine, 'line' | 'customId'>) => string,
    onlyPending?: boolean,
  ): Promise<number>
  /** Lines still pending or running. */
  openLineCount(batchId: string): Promise<number>
  /** Finished results in line order: the output (ok) or the error file (not ok). */
  lineResults(batchId: string, ok: boolean): Promise<string[]>
  /** Sum of the ledger rows of a batch. */
  batchCostNano(batchId: string): Promise<NanoRub>

  /** Stores a response (its id is new). */
  putResponse(r: ResponseRecord): Promise<void>
  /** A response of this organization; undefined when absent or another organization's. */
  getResponse(orgId: string, id: string): Promise<ResponseRecord | undefined>
  /** Deletes a response of this organization; whether there was one. */
  deleteResponse(orgId: string, id: string): Promise<boolean>
  /** Deletes up to `limit` responses created before this Unix time (retention); how many. */
  deleteResponsesBefore(createdAt: number, limit: number): Promise<number>

  insertConsoleSession(s: ConsoleSessionRecord): Promise<void>
  getConsoleSession(id: string): Promise<ConsoleSessionRecord | undefined>
  /** Marks a session used at `atSec`. */
  touchConsoleSession(id: string, atSec: number): Promise<void>
  /** Deletes a session (logout); whether there was one. */
  deleteConsoleSession(id: string): Promise<boolean>
  /** Deletes up to `limit` sessions last used before this Unix time; how many. */
  deleteConsoleSessionsIdleBefore(atSec: number, limit: number): Promise<number>

  insertWebhook(w: WebhookRecord): Promise<void>
  getWebhook(id: string): Promise<WebhookRecord | undefined>
  /** An organization's webhooks, oldest first; every organization's when orgId is undefined. */
  listWebhooks(orgId?: string): Promise<WebhookRecord[]>
  updateWebhook(id: string, patch: WebhookPatch): Promise<WebhookRecord | undefined>
  /** Deletes a webhook and its outbox rows; whether there was one. */
  deleteWebhook(id: string): Promise<boolean>
  /**
   * Sets balance_below from `!below` to `below` (compare and set, so of several nodes seeing the
   * same crossing one wins) and, when it changed and `event` is given, writes the event in the
   * same transaction. Whether it changed.
   */
  setWebhookBalanceBelow(id: string, below: boolean, event?: NewWebhookEvent): Promise<boolean>
  /** Writes events to the outbox; a (webhook, event id) already there is skipped. How many were new. */
  enqueueWebhookEvents(events: readonly NewWebhookEvent[]): Promise<number>
  /**
   * Leases up to `limit` due events of enabled webhooks (pending, next attempt and any lease
   * past) until `nowMs + leaseMs`, counting an attempt; with several nodes each row goes to one.
   */
  claimWebhookEvents(nowMs: number, leaseMs: number, limit: number): Promise<WebhookDeliveryJob[]>
  /** Records an attempt's end and drops the lease. */
  finishWebhookEvent(webhookId: string, eventId: string, a: WebhookAttempt): Promise<void>
  /** Drops every lease (one node owns a SQLite file: its leases died with the last process). */
  releaseWebhookLeases(): Promise<number>
  /** A webhook's outbox rows, newest first. */
  listWebhookEvents(webhookId: string, limit: number): Promise<WebhookEventRecord[]>
  /** Deletes up to `limit` delivered or failed rows created before `beforeMs`; how many. */
  pruneWebhookEvents(beforeMs: number, limit: number): Promise<number>
  /** Every receipt key, oldest generation first. */
  receiptKeys(): Promise<ReceiptKeyRecord[]>
  /** Adds a receipt key unless its generation (or kid) is taken; whether it was added. */
  addReceiptKey(k: ReceiptKeyRecord): Promise<boolean>

  close(): Promise<void>
}
