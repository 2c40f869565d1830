import type { Budget } from '../billing/budgets.ts'
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
  /** Unix seconds after which the key is refused; null: never. */
  expiresAt: number | null
  /** The model ids or patterns the key may use; null: every model. */
  models: readonly string[] | null
  /** A budget that resets every period (day, week, month in a zone); null: none. */
  budget: Budget | null
  /** The budget each end user of the key gets every period; null: none. */
  endUserBudget: Budget | null
  /** `models` as one expression (a trailing or inner `*` matches any characters). */
  private allowed: RegExp | null

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
    this.expiresAt = r.expiresAt
    this.models = r.models
    this.budget = r.budget ?? null
    this.endUserBudget = r.endUserBudget ?? null
    this.allowed = modelPattern(r.models)
  }

  /** Sets the models the key may use (its matcher with them). */
  setModels(models: readonly string[] | null): void {
    this.models = models
    this.allowed = modelPattern(models)
  }

  /** Whether the key may use this catalogue model. */
  allows(modelId: string): boolean {
    return this.allowed === null || this.allowed.test(modelId)
  }

  /** Whether the key has expired at `nowSec` (the API lists it as `expired`). */
  expired(nowSec: number): boolean {
    return this.expiresAt !== null && nowSec >= this.expiresAt
  }
}

/** One anchored expression for a key's model ids and patterns; null: no restriction. */
export function modelPattern(models: readonly string[] | null): RegExp | null {
  if (models === null) return null
  if (models.length === 0) return /$^/
  const alt = models.map((m) => m.split('*').map(escapeRegExp).join('.*')).join('|')
  return new RegExp(`^(?:${alt})$`)
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
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
