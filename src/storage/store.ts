import type { NanoRub } from '../billing/money.ts'

export type KeyKind = 'api' | 'master'
export type KeyStatus = 'active' | 'disabled' | 'revoked'

export interface OrgRecord {
  readonly id: string
  readonly name: string
  readonly balanceNano: NanoRub
  readonly createdAt: number
}

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
}

export type KeyPatch = Partial<
  Pick<KeyRecord, 'name' | 'limitNano' | 'status' | 'revokedAt' | 'rpmLimit' | 'tpmLimit'>
>

/** One billed request (or balance credit): the ledger row of decisions.md. */
export interface LedgerEntry {
  readonly requestId: string
  readonly kind: 'usage' | 'credit'
  readonly orgId: string
  readonly keyId: string | null
  readonly model: string | null
  readonly node: string | null
  readonly promptTokens: number
  readonly completionTokens: number
  /** Charged amount; a credit is positive and adds to the balance. */
  readonly costNano: NanoRub
  readonly batchId: string | null
  readonly startedAtMs: number
  readonly endedAtMs: number
  readonly outcome: string
  /** Tokens were counted by Tropa because the upstream reported no usage. */
  readonly estimated: boolean
}

/** Usage of one key on one model on one UTC day. */
export interface UsageRow {
  readonly keyId: string | null
  readonly model: string | null
  /** UTC date, YYYY-MM-DD. */
  readonly day: string
  readonly requests: number
  readonly promptTokens: number
  readonly completionTokens: number
  readonly costNano: NanoRub
}

export interface KeyListQuery {
  readonly orgId: string
  readonly kind: KeyKind
  readonly status?: KeyStatus | undefined
  readonly afterId?: string | undefined
  readonly limit: number
}

/** The only storage type services see. SQLite (embedded) and PostgreSQL implement it. */
export interface Store {
  getMeta(key: string): Promise<string | undefined>
  /** Sets the value only if the key is absent; returns the value now stored. */
  initMeta(key: string, value: string): Promise<string>

  insertOrg(org: OrgRecord): Promise<void>
  getOrg(id: string): Promise<OrgRecord | undefined>
  findOrgByName(name: string): Promise<OrgRecord | undefined>

  insertKey(key: KeyRecord): Promise<void>
  getKey(id: string): Promise<KeyRecord | undefined>
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
  ledgerForOrg(orgId: string, fromMs: number, toMs: number): Promise<LedgerEntry[]>
  /** Billed usage (credits excluded) grouped by key, model and UTC day, ordered by day. */
  usageByKeyModelDay(orgId: string, fromMs: number, toMs: number): Promise<UsageRow[]>

  close(): Promise<void>
}
