import type { Budget } from '../billing/budgets.ts'
import type { BudgetNow, MoneyMeter } from '../billing/meter.ts'
import { MAX_AMOUNT_NANO, MAX_AMOUNT_RUB, type NanoRub, nanoToRubNumber } from '../billing/money.ts'
import type { ClusterBus } from '../cluster/bus.ts'
import {
  Conflict,
  InvalidValue,
  invalidApiKey,
  keyDisabled,
  keyExpired,
  keyNotFound,
  keyRevoked,
  missingApiKey,
  orgNotFound,
  SharedStateUnavailable,
  TropaError,
} from '../errors.ts'
import { requestId, sortableId } from '../ids.ts'
import type { KeyKind, KeyPatch, KeyRecord, KeyStatus, OrgPatch, Store } from '../storage/store.ts'
import { LiveKey, LiveOrg, type Principal } from './live.ts'
import { hashSecret, newSecret, secretHint } from './secrets.ts'

const noop = () => {}

export interface NewKey {
  readonly name: string
  readonly limitNano: NanoRub | null
  readonly rpmLimit?: number | null
  readonly tpmLimit?: number | null
  readonly expiresAt?: number | null
  readonly models?: readonly string[] | null
  readonly maxConcurrency?: number | null
  readonly budget?: Budget | null
  readonly endUserBudget?: Budget | null
}

export interface KeyChanges {
  readonly name?: string
  readonly limitNano?: NanoRub | null
  readonly disabled?: boolean
  readonly rpmLimit?: number | null
  readonly tpmLimit?: number | null
  readonly expiresAt?: number | null
  readonly models?: readonly string[] | null
  readonly maxConcurrency?: number | null
  readonly budget?: Budget | null
  readonly endUserBudget?: Budget | null
}

/**
 * Organizations and keys. Every key and organization lives in memory (loaded at start and
 * written through), so authenticating a request is a hash and a map lookup, never a query.
 */
export class IdentityService {
  private readonly byHash = new Map<string, LiveKey>()
  private readonly byId = new Map<string, LiveKey>()
  private readonly orgs = new Map<string, LiveOrg>()

  private meter: MoneyMeter | undefined

  /** The meter to tell about limit changes and credits (its rooms must follow them). */
  useMeter(m: MoneyMeter): void {
    this.meter = m
  }

  /**
   * Several workers of one process (src/workers/): a worker hands credits to the primary, which
   * writes them and holds the balances; the primary sets `balancesHere`, so an organization's event
   * from a worker never overwrites a balance it holds unflushed charges against.
   */
  private creditor: ((org: LiveOrg, amountNano: NanoRub, reason: string | null) => Promise<void>) | undefined
  balancesHere = false

  useCreditor(f: (org: LiveOrg, amountNano: NanoRub, reason: string | null) => Promise<void>): void {
    this.creditor = f
  }

  /** Hashes seen to be no key at all (shared mode), so bad keys cannot hammer the database. */
  private readonly unknown = new Map<string, number>()
  /** When a key was last confirmed against the store while the bus was down. */
  private readonly confirmedAt = new Map<string, number>()

  private constructor(
    private readonly store: Store,
    private readonly adminHash: string | undefined,
    private readonly bus: ClusterBus | undefined,
    private readonly boundMs: number,
  ) {}

  /**
   * With a bus (several nodes on one PostgreSQL), keys changed on other nodes arrive as events;
   * keys created elsewhere are looked up on first sight.
   */
  static async open(
    store: Store,
    adminToken: string | undefined,
    bus?: ClusterBus,
    boundMs = 1000,
  ): Promise<IdentityService> {
    const svc = new IdentityService(store, adminToken ? hashSecret(adminToken) : undefined, bus, boundMs)
    for (const o of await store.loadOrgs()) svc.orgs.set(o.id, new LiveOrg(o))
    for (const k of await store.loadKeys()) svc.remember(new LiveKey(k))
    await bus?.subscribe((e) => {
      // The acknowledgement (publishAndConfirm) follows the promise returned: the change is
      // read here before the node that made it answers.
      if (e.t === 'org') {
        const live = svc.orgs.get(e.id)
        // Created elsewhere: read once, by the path every first sight takes.
        if (!live) return Promise.resolve(svc.orgOrLoad(e.id)).then(noop, noop)
        // Credited elsewhere: take the store's balance (it holds every node's flushed spend).
        if (!e.limits && svc.balancesHere) return
        return store.getOrg(e.id).then((o) => {
          if (!o) return
          if (e.limits) live.setLimits(o)
          else live.balanceNano = o.balanceNano
        }, noop)
      }
      // Apply the status at once, then the rest.
      const key = svc.byId.get(e.id)
      if (key && e.status) key.status = e.status
      return svc.reloadKey(e.id)
    })
    return svc
  }

  /** Resolves an Authorization header to who is calling; throws 401 otherwise. Memory only. */
  authenticate(authorization: string | null | undefined): Principal {
    const hash = this.hashOf(authorization)
    if (this.adminHash !== undefined && hash === this.adminHash) return { kind: 'admin' }
    const key = this.byHash.get(hash)
    if (!key) throw invalidApiKey()
    this.rememberHeader(authorization!, hash)
    return this.principalOf(key)
  }

  /**
   * The same, for a node sharing state with others: a key unknown here may have been created on
   * another node (looked up once), and while the event bus is down every key is confirmed against
   * the store at least every half bound, so a revocation is never missed for longer than the bound.
   */
  async authenticateShared(authorization: string | null | undefined): Promise<Principal> {
    if (!this.bus) return this.authenticate(authorization)
    const hash = this.hashOf(authorization)
    if (this.adminHash !== undefined && hash === this.adminHash) return { kind: 'admin' }
    let key = this.byHash.get(hash)
    const now = Date.now()
    try {
      if (!key) {
        if ((this.unknown.get(hash) ?? 0) > now) throw invalidApiKey()
        const rec = await this.store.getKeyByHash(hash)
        if (!rec) {
          if (this.unknown.size > 100_000) this.unknown.clear()
          this.unknown.set(hash, now + this.boundMs)
          throw invalidApiKey()
        }
        key = await this.adopt(rec)
        this.confirmedAt.set(key.id, now)
      } else if (
        this.bus.healthy()
          ? // Events sent while this node was not listening are lost: confirm once after (re)subscribing.
            (this.confirmedAt.get(key.id) ?? 0) < this.bus.listeningSinceMs()
          : now - (this.confirmedAt.get(key.id) ?? 0) > this.boundMs / 2
      ) {
        const rec = await this.store.getKey(key.id)
        if (rec) this.apply(key, rec)
        this.confirmedAt.set(key.id, now)
      }
    } catch (err) {
      if (err instanceof TropaError) throw err
      throw new SharedStateUnavailable()
    }
    this.rememberHeader(authorization!, hash)
    return this.principalOf(key)
  }

  /**
   * Headers of known keys and their hashes, so a key's every request does not pay for SHA-256.
   * Only headers that named a real key get in (random tokens cannot churn it); a key's status is
   * still read on every request, so revocation is unaffected.
   */
  private readonly hashMemo = new Map<string, string>()

  private rememberHeader(authorization: string, hash: string): void {
    if (this.hashMemo.size >= 10_000) this.hashMemo.clear()
    this.hashMemo.set(authorization, hash)
  }

  private hashOf(authorization: string | null | undefined): string {
    const memo = authorization ? this.hashMemo.get(authorization) : undefined
    if (memo !== undefined) return memo
    if (!authorization || authorization.trim().toLowerCase() === 'bearer') throw missingApiKey()
    if (authorization.length < 8 || authorization.slice(0, 7).toLowerCase() !== 'bearer ')
      throw invalidApiKey()
    const token = authorization.slice(7).trim()
    if (token.length === 0) throw missingApiKey()
    // Comparing hashes keeps the admin check constant-time with respect to the secret.
    return hashSecret(token)
  }

  private principalOf(key: LiveKey): Principal {
    if (key.status === 'revoked') throw keyRevoked()
    if (key.status === 'disabled') throw keyDisabled()
    if (key.expiresAt !== null && key.expired(Date.now() / 1000)) throw keyExpired()
    const org = this.orgs.get(key.orgId)
    if (!org) throw invalidApiKey()
    return { kind: key.kind, key, org }
  }

  /** Organizations being read on first sight: every caller waits for the same read. */
  private readonly orgsLoading = new Map<string, Promise<LiveOrg | undefined>>()

  /** An organization, read from the store on first sight (once, whoever asks meanwhile). */
  orgOrLoad(id: string): LiveOrg | Promise<LiveOrg | undefined> {
    const live = this.orgs.get(id)
    if (live) return live
    let loading = this.orgsLoading.get(id)
    if (!loading) {
      loading = this.store
        .getOrg(id)
        .then((o) => {
          if (!o) return undefined
          const org = this.orgs.get(id) ?? new LiveOrg(o)
          this.orgs.set(id, org)
          return org
        })
        .finally(() => this.orgsLoading.delete(id))
      this.orgsLoading.set(id, loading)
    }
    return loading
  }

  /** Any key by id, read from the store on first sight (the primary of several workers). */
  keyOrLoad(id: string): LiveKey | Promise<LiveKey | undefined> {
    const key = this.byId.get(id)
    if (key) return key
    return this.store.getKey(id).then((rec) => (rec ? this.adopt(rec) : undefined))
  }

  /** A key (and its organization) first seen on this node. */
  private async adopt(rec: KeyRecord): Promise<LiveKey> {
    if (!this.orgs.has(rec.orgId)) await this.orgOrLoad(rec.orgId)
    const existing = this.byId.get(rec.id)
    if (existing) return existing
    const key = new LiveKey(rec)
    this.remember(key)
    return key
  }

  private apply(key: LiveKey, rec: KeyRecord) {
    key.status = rec.status
    key.name = rec.name
    key.limitNano = rec.limitNano
    key.revokedAt = rec.revokedAt
    key.rpmLimit = rec.rpmLimit
    key.tpmLimit = rec.tpmLimit
    key.expiresAt = rec.expiresAt
    key.maxConcurrency = rec.maxConcurrency
    key.setModels(rec.models)
    key.budget = rec.budget ?? null
    key.endUserBudget = rec.endUserBudget ?? null
  }

  /** Another node changed a key: take the store's version. */
  private async reloadKey(id: string) {
    const rec = await this.store.getKey(id).catch(() => undefined)
    if (!rec) return
    const key = this.byId.get(id)
    if (key) this.apply(key, rec)
    else await this.adopt(rec)
  }

  /** A key was created or changed: every node has read it when this resolves (or the bound passed). */
  private async announce(id: string): Promise<void> {
    if (this.bus) await this.bus.publishAndConfirm({ t: 'key', id, from: this.bus.nodeId }, this.boundMs)
  }

  org(id: string): LiveOrg {
    const org = this.orgs.get(id)
    if (!org) throw orgNotFound(id)
    return org
  }

  async createOrg(
    name: string,
    nowSec = Math.floor(Date.now() / 1000),
    limits: OrgPatch = {},
  ): Promise<LiveOrg> {
    if (await this.store.findOrgByName(name))
      throw new Conflict(`an organization named ${JSON.stringify(name)} exists`, 'org_exists')
    const rec = { id: `org_${sortableId()}`, name, balanceNano: 0n, createdAt: nowSec, ...limits }
    await this.store.insertOrg(rec)
    const org = new LiveOrg(rec)
    this.orgs.set(org.id, org)
    // Known to every node before the answer, so the next call may reach any of them.
    await this.bus?.publishAndConfirm({ t: 'org', id: org.id, from: this.bus.nodeId }, this.boundMs)
    return org
  }

  /**
   * Changes an organization's rate limits (null clears one); every node takes them from the
   * store on the organization's event.
   */
  async updateOrg(org: LiveOrg, patch: OrgPatch): Promise<LiveOrg> {
    const rec = await this.store.updateOrg(org.id, patch)
    if (!rec) throw orgNotFound(org.id)
    org.setLimits(rec)
    await this.bus?.publishAndConfirm(
      { t: 'org', id: org.id, from: this.bus.nodeId, limits: true },
      this.boundMs,
    )
    return org
  }

  /** Every organization, oldest first (those another node created are adopted here). */
  async listOrgs(): Promise<LiveOrg[]> {
    const recs = await this.store.loadOrgs()
    return recs
      .map((r) => {
        let org = this.orgs.get(r.id)
        if (!org) {
          org = new LiveOrg(r)
          this.orgs.set(r.id, org)
        }
        return org
      })
      .sort((a, b) => a.createdAt - b.createdAt || (a.id < b.id ? -1 : 1))
  }

  async findOrgByName(name: string): Promise<LiveOrg | undefined> {
    const rec = await this.store.findOrgByName(name)
    return rec ? this.orgs.get(rec.id) : undefined
  }

  /**
   * Adds to an organization's balance (a negative amount is a debit), with a ledger row of its
   * own and the operator's reason; written before it counts.
   */
  async credit(org: LiveOrg, amountNano: NanoRub, reason: string | null = null): Promise<void> {
    if (this.creditor) {
      await this.creditor(org, amountNano, reason)
      // This worker's copy, for what it shows until the primary's figure is asked (orgNow).
      org.balanceNano += amountNano
      return
    }
    // A balance stays within what both stores hold exactly (see MAX_AMOUNT_NANO), counting the
    // credits this node is still writing (they count only once written).
    const inFlight = this.creditsInFlight.get(org.id) ?? 0n
    if (org.balanceNano + inFlight + amountNano > MAX_AMOUNT_NANO)
      throw new InvalidValue(`the balance would exceed ${MAX_AMOUNT_RUB} roubles`, 'amount_rub')
    if (amountNano < 0n) {
      // A debit takes no more than the balance holds now (the cluster's figure, other debits
      // being written included); charges settling meanwhile may still take it below zero,
      // after which the organization's requests get 402 until it is credited.
      const { balanceNano } = await this.orgNow(org)
      if (balanceNano + inFlight + amountNano < 0n)
        throw new Conflict('the debit exceeds the balance', 'insufficient_balance')
    }
    this.creditsInFlight.set(org.id, inFlight + amountNano)
    try {
      await this.writeCredit(org, amountNano, reason)
    } finally {
      const left = (this.creditsInFlight.get(org.id) ?? 0n) - amountNano
      if (left === 0n) this.creditsInFlight.delete(org.id)
      else this.creditsInFlight.set(org.id, left)
    }
    org.balanceNano += amountNano
    this.meter?.credited?.(org, amountNano)
    if (this.bus) void this.bus.publish({ t: 'org', id: org.id, from: this.bus.nodeId }).catch(() => {})
  }

  /** Credits being written, per organization. */
  private readonly creditsInFlight = new Map<string, NanoRub>()

  private async writeCredit(org: LiveOrg, amountNano: NanoRub, reason: string | null): Promise<void> {
    const now = Date.now()
    await this.store.recordLedger([
      {
        requestId: `credit_${requestId()}`,
        kind: 'credit',
        orgId: org.id,
        keyId: null,
        model: null,
        node: null,
        promptTokens: 0,
        completionTokens: 0,
        costNano: amountNano,
        batchId: null,
        startedAtMs: now,
        endedAtMs: now,
        outcome: 'credit',
        estimated: false,
        reason,
      },
    ])
  }

  async createKey(org: LiveOrg, kind: KeyKind, k: NewKey): Promise<{ key: LiveKey; secret: string }> {
    const secret = newSecret(kind === 'api' ? 'sk' : 'mk')
    const rec: KeyRecord = {
      id: `key_${sortableId()}`,
      orgId: org.id,
      kind,
      name: k.name,
      secretHash: hashSecret(secret),
      hint: secretHint(secret),
      limitNano: k.limitNano,
      spentNano: 0n,
      status: 'active',
      createdAt: Math.floor(Date.now() / 1000),
      lastUsedAt: null,
      revokedAt: null,
      rpmLimit: k.rpmLimit ?? null,
      tpmLimit: k.tpmLimit ?? null,
      expiresAt: k.expiresAt ?? null,
      models: k.models ?? null,
      maxConcurrency: k.maxConcurrency ?? null,
      budget: k.budget ?? null,
      endUserBudget: k.endUserBudget ?? null,
    }
    await this.store.insertKey(rec)
    const key = new LiveKey(rec)
    this.remember(key)
    await this.announce(key.id)
    return { key, secret }
  }

  /**
   * Who a console session acts as: the master key that signed in, checked now (a key revoked or
   * disabled since ends its sessions), looked up in the store when another node created it.
   */
  async principalOfKey(id: string): Promise<Principal> {
    let key = this.byId.get(id)
    if (!key) {
      const rec = await this.store.getKey(id)
      if (!rec) throw invalidApiKey()
      key = await this.adopt(rec)
    }
    return this.principalOf(key)
  }

  /** Any key by id (internal use: batches run with the key that created them). */
  keyById(id: string): LiveKey | undefined {
    return this.byId.get(id)
  }

  /** A key of this organization; another organization's key is reported as not found. */
  key(orgId: string, id: string, kind: KeyKind): LiveKey {
    const key = this.byId.get(id)
    if (!key || key.orgId !== orgId || key.kind !== kind) throw keyNotFound(id)
    return key
  }

  async listKeys(q: { orgId: string; kind: KeyKind; status?: KeyStatus; afterId?: string; limit: number }) {
    // Ids come from the store (ordering, paging); on one node the live objects carry unflushed
    // spend. With several nodes each spends apart: the records, with the cluster's spend.
    const rows = await this.store.listKeys(q)
    if (!this.meter?.standing) return rows.map((r) => this.byId.get(r.id) ?? new LiveKey(r))
    const keys = rows.map((r) => new LiveKey(r))
    await this.withClusterSpend(q.orgId, keys)
    return keys
  }

  /** A key as its record should be shown: with several nodes, the cluster's spend and last use. */
  async current(key: LiveKey): Promise<LiveKey> {
    if (!this.meter?.standing) return key
    const rec = await this.store.getKey(key.id)
    const shown = rec ? new LiveKey(rec) : key
    await this.withClusterSpend(key.orgId, [shown])
    return shown
  }

  /**
   * An organization's balance and money reserved in flight as they stand now: on one node its
   * live object; with several nodes, every node's charges and holds (the meter's shared rooms),
   * where a node's own copy knows only its own since the last credit.
   */
  async orgNow(org: LiveOrg): Promise<{ balanceNano: NanoRub; reservedNano: NanoRub }> {
    return this.meter?.standing ? this.meter.standing(org, []) : org
  }

  /** Where a key's period budget stands now (every node's charges and holds); undefined without one. */
  async budgetNow(key: LiveKey): Promise<BudgetNow | undefined> {
    if (key.budget === null || !this.meter) return undefined
    return this.meter.budgetNow(key)
  }

  /** Sets shown copies' spend to the cluster's (unflushed charges of every node included). */
  private async withClusterSpend(orgId: string, keys: LiveKey[]): Promise<void> {
    const org = this.orgs.get(orgId)
    if (!org || keys.length === 0 || !this.meter?.standing) return
    const s = await this.meter.standing(org, keys)
    for (const k of keys) k.spentNano = s.spentNano.get(k.id) ?? k.spentNano
  }

  async updateKey(key: LiveKey, c: KeyChanges): Promise<LiveKey> {
    if (key.status === 'revoked') {
      if (Object.keys(c).length === 0) return key
      throw new Conflict('a revoked key cannot be changed', 'key_already_revoked')
    }
    const patch: KeyPatch = {
      ...(c.name !== undefined && { name: c.name }),
      ...(c.limitNano !== undefined && { limitNano: c.limitNano }),
      ...(c.disabled !== undefined && { status: c.disabled ? 'disabled' : 'active' }),
      ...(c.rpmLimit !== undefined && { rpmLimit: c.rpmLimit }),
      ...(c.tpmLimit !== undefined && { tpmLimit: c.tpmLimit }),
      ...(c.expiresAt !== undefined && { expiresAt: c.expiresAt }),
      ...(c.models !== undefined && { models: c.models }),
      ...(c.maxConcurrency !== undefined && { maxConcurrency: c.maxConcurrency }),
      ...(c.budget !== undefined && { budget: c.budget }),
      ...(c.endUserBudget !== undefined && { endUserBudget: c.endUserBudget }),
    }
    const limitBefore = key.limitNano
    await this.store.updateKey(key.id, patch)
    const { models, ...rest } = patch
    Object.assign(key, rest)
    if (models !== undefined) key.setModels(models)
    if (patch.limitNano !== undefined && patch.limitNano !== limitBefore)
      this.meter?.limitChanged?.(key, limitBefore, patch.limitNano)
    if (patch.status && this.bus)
      await this.bus.publishAndConfirm(
        { t: 'key', id: key.id, from: this.bus.nodeId, status: patch.status },
        this.boundMs,
      )
    else await this.announce(key.id)
    return key
  }

  /** Irreversible; revoking twice is a no-op that succeeds. */
  async revokeKey(key: LiveKey): Promise<void> {
    if (key.status === 'revoked') return
    const revokedAt = Math.floor(Date.now() / 1000)
    await this.store.updateKey(key.id, { status: 'revoked', revokedAt })
    key.status = 'revoked'
    key.revokedAt = revokedAt
    // The response to DELETE waits until every node has applied the revocation (or the bound
    // passed, after which a node that missed it confirms keys against the store).
    await this.bus?.publishAndConfirm(
      { t: 'key', id: key.id, from: this.bus.nodeId, status: 'revoked' },
      this.boundMs,
    )
  }

  balanceRub(org: LiveOrg): number {
    return nanoToRubNumber(org.balanceNano)
  }

  private remember(key: LiveKey) {
    this.byHash.set(key.secretHash, key)
    this.byId.set(key.id, key)
  }
}
