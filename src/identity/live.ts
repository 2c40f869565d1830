import type { Budget } from '../billing/budgets.ts'
import type { NanoRub } from '../billing/money.ts'
import type { KeyKind, KeyRecord, KeyStatus, ModelLimits, OrgRecord } from '../storage/store.ts'

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
  /** Requests of this key in flight at once across the cluster; null: no bound. */
  maxConcurrency: number | null
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
    this.maxConcurrency = r.maxConcurrency ?? null
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
  /** Requests and tokens per minute over all the organization's keys; null: none. */
  rpmLimit: number | null = null
  tpmLimit: number | null = null
  /** Per-model limits by model id or pattern; null: none. */
  modelLimits: ModelLimits | null = null
  /** The limits above, ready for admission; null when there are none (the hot path reads only this). */
  rates: OrgRates | null = null

  constructor(r: OrgRecord) {
    this.id = r.id
    this.name = r.name
    this.createdAt = r.createdAt
    this.balanceNano = r.balanceNano
    this.setLimits(r)
  }

  /** Takes the record's rate limits. */
  setLimits(r: Pick<OrgRecord, 'rpmLimit' | 'tpmLimit' | 'modelLimits'>): void {
    this.rpmLimit = r.rpmLimit ?? null
    this.tpmLimit = r.tpmLimit ?? null
    const models = r.modelLimits ?? null
    this.modelLimits = models !== null && Object.keys(models).length > 0 ? models : null
    this.rates =
      this.rpmLimit === null && this.tpmLimit === null && this.modelLimits === null
        ? null
        : new OrgRates(this.rpmLimit, this.tpmLimit, this.modelLimits)
  }
}

/** A per-model limit that applies to one model: the entry (its id or pattern) and its bounds. */
export interface AppliedModelLimit {
  readonly entry: string
  readonly rpm: number | null
  readonly tpm: number | null
}

/**
 * An organization's rate limits as admission reads them. A model's limit is the entry naming it
 * exactly, else the most specific pattern matching it (the one with the most characters besides
 * `*`; equal ones by the entry's text); each model is counted on its own.
 */
export class OrgRates {
  private readonly patterns: { entry: string; re: RegExp; rpm: number | null; tpm: number | null }[]
  /** The limit that applies, per model id asked about (a catalogue's worth at most). */
  private readonly memo = new Map<string, AppliedModelLimit | null>()

  constructor(
    readonly rpm: number | null,
    readonly tpm: number | null,
    private readonly models: ModelLimits | null,
  ) {
    this.patterns = Object.entries(models ?? {})
      .filter(([entry]) => entry.includes('*'))
      .sort(([a], [b]) => b.replaceAll('*', '').length - a.replaceAll('*', '').length || (a < b ? -1 : 1))
      .map(([entry, l]) => ({ entry, re: modelPattern([entry])!, rpm: l.rpm, tpm: l.tpm }))
  }

  /** The per-model limit that applies to `modelId`, or null. */
  forModel(modelId: string): AppliedModelLimit | null {
    if (this.models === null) return null
    let hit = this.memo.get(modelId)
    if (hit !== undefined) return hit
    const exact = Object.hasOwn(this.models, modelId) ? this.models[modelId] : undefined
    const p = exact ? undefined : this.patterns.find((x) => x.re.test(modelId))
    hit = exact
      ? { entry: modelId, rpm: exact.rpm, tpm: exact.tpm }
      : p
        ? { entry: p.entry, rpm: p.rpm, tpm: p.tpm }
        : null
    if (this.memo.size >= 10_000) this.memo.clear()
    this.memo.set(modelId, hit)
    return hit
  }
}

export type Principal =
  | { readonly kind: 'admin' }
  | { readonly kind: 'master'; readonly key: LiveKey; readonly org: LiveOrg }
  | { readonly kind: 'api'; readonly key: LiveKey; readonly org: LiveOrg }
