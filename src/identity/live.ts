import type { NanoRub } from '../billing/money.ts'
import type { KeyKind, KeyRecord, KeyStatus, OrgRecord } from '../storage/store.ts'

/**
 * The in-memory state of a key on this node: what the store holds plus money reserved by
 * requests in flight. The hot path reads only these objects, never the database.
 */
export class LiveKey {
  readonly id: string
  readonly orgId: string
  readonly kind: KeyKind
  readonly secretHash: string
  readonly hint: string
  readonly createdAt: number
  name: string
  status: KeyStatus
  limitNano: NanoRub | null
  /** Settled spend, including settlements not yet flushed to the store. */
  spentNano: NanoRub
  /** Worst-case cost of requests in flight. */
  reservedNano: NanoRub = 0n
  lastUsedAt: number | null
  revokedAt: number | null
  rpmLimit: number | null
  tpmLimit: number | null

  constructor(r: KeyRecord) {
    this.id = r.id
    this.orgId = r.orgId
    this.kind = r.kind
    this.secretHash = r.secretHash
    this.hint = r.hint
    this.createdAt = r.createdAt
    this.name = r.name
    this.status = r.status
    this.limitNano = r.limitNano
    this.spentNano = r.spentNano
    this.lastUsedAt = r.lastUsedAt
    this.revokedAt = r.revokedAt
    this.rpmLimit = r.rpmLimit
    this.tpmLimit = r.tpmLimit
  }
}

/** An organization's balance on this node: committed balance and in-flight reservations. */
export class LiveOrg {
  readonly id: string
  readonly name: string
  readonly createdAt: number
  balanceNano: NanoRub
  reservedNano: NanoRub = 0n

  constructor(r: OrgRecord) {
    this.id = r.id
    this.name = r.name
    this.createdAt = r.createdAt
    this.balanceNano = r.balanceNano
  }
}

export type Principal =
  | { readonly kind: 'admin' }
  | { readonly kind: 'master'; readonly key: LiveKey; readonly org: LiveOrg }
  | { readonly kind: 'api'; readonly key: LiveKey; readonly org: LiveOrg }
