import type { BudgetFigures, SpendFigures, SpendWatch } from '../billing/meter.ts'
import { type NanoRub, nanoToRubNumber } from '../billing/money.ts'
import { Conflict, InvalidValue, NotFound, quoted } from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import { randomBase62, sortableId } from '../ids.ts'
import type { Log } from '../log.ts'
import type { BatchRecord, NewWebhookEvent, Store, WebhookRecord } from '../storage/store.ts'
import type { WebhookEventType } from './event-types.ts'
import { eventId, eventPayload } from './events.ts'
import { webhookUrl } from './urls.ts'

/** Webhooks one organization may have. */
export const MAX_WEBHOOKS_PER_ORG = 16

export interface NewWebhook {
  readonly url: string
  readonly events: readonly WebhookEventType[]
  readonly balanceThresholdNano: NanoRub | null
  readonly enabled: boolean
}

export type WebhookChanges = Partial<NewWebhook>

/** A key's limit or period budget, as the alerts about it see it. */
export interface KeyAllowance {
  readonly kind: 'limit' | 'budget'
  readonly amountNano: NanoRub
  readonly spentNano: NanoRub
  /** What identifies this allowance's stretch: the limit's amount; a budget's period start (and amount). */
  readonly scope: string
  /** Extra fields for the event's data (a budget's period, resets_at). */
  readonly data?: Record<string, unknown>
}

const LEVELS = [80, 100] as const
const FIRED_MAX = 100_000

const notFound = (id: string) => new NotFound(`no webhook ${quoted(id)}`, 'webhook_not_found')

/**
 * Organizations' webhooks: the API's calls, and the alerts. Every enabled webhook is kept in memory
 * (loaded at start; with several nodes read again every poll), so after a settled charge the
 * question "does this organization want alerts" is one map lookup.
 *
 * Alerts are written to the store's outbox (webhook_events) before anything is delivered; an
 * alert's id comes from what happened (`key.limit_80:<key>:<limit>`), and the outbox keeps one
 * row per (webhook, id), so nodes that notice the same crossing write it once. A node remembers
 * the ids it wrote, so a key past 80% costs no store write per request.
 */
export class Webhooks implements SpendWatch {
  /** Enabled webhooks by organization. */
  private byOrg = new Map<string, WebhookRecord[]>()
  /** Organizations with an enabled webhook for a spend event (limits, budgets, balance). */
  private spendOrgs = new Set<string>()
  /** Whether balance.below_threshold was sent for a webhook (this node's copy of balance_below). */
  private readonly below = new Map<string, boolean>()
  /**
   * Key events this node wrote (or found written), as `<kind>_<pct>:<key>:<scope>`: not written
   * again. Bounded: past FIRED_MAX it is emptied (the outbox's unique id still keeps one row).
   */
  private readonly fired = new Set<string>()
  /** Alert work per organization, in order (a crossing is looked at once at a time). */
  private readonly chains = new Map<string, Promise<void>>()

  private constructor(
    private readonly store: Store,
    private readonly allowPrivateUrls: boolean,
    private readonly log: Log,
    private readonly now: () => number = Date.now,
  ) {}

  static async open(
    store: Store,
    allowPrivateUrls: boolean,
    log: Log,
    now?: () => number,
  ): Promise<Webhooks> {
    const w = new Webhooks(store, allowPrivateUrls, log, now)
    await w.refresh()
    return w
  }

  /** Reads every webhook again (another node may have changed them). */
  async refresh(): Promise<void> {
    const all = await this.store.listWebhooks()
    const byOrg = new Map<string, WebhookRecord[]>()
    const spend = new Set<string>()
    for (const w of all) {
      this.below.set(w.id, w.balanceBelow)
      if (!w.enabled) continue
      const list = byOrg.get(w.orgId) ?? []
      list.push(w)
      byOrg.set(w.orgId, list)
      if (w.events.some((e) => e.startsWith('key.') || e === 'balance.below_threshold')) spend.add(w.orgId)
    }
    this.byOrg = byOrg
    this.spendOrgs = spend
  }

  // The API.

  async create(org: LiveOrg, n: NewWebhook): Promise<{ webhook: WebhookRecord; secret: string }> {
    checkEvents(n.events, n.balanceThresholdNano)
    const existing = await this.store.listWebhooks(org.id)
    if (existing.length >= MAX_WEBHOOKS_PER_ORG)
      throw new Conflict(
        `an organization may have at most ${MAX_WEBHOOKS_PER_ORG} webhooks; delete one first`,
        'too_many_webhooks',
      )
    const secret = `whsec_${randomBase62(32)}`
    const webhook: WebhookRecord = {
      id: `wh_${sortableId()}`,
      orgId: org.id,
      url: webhookUrl(n.url, this.allowPrivateUrls),
      secret,
      events: [...new Set(n.events)],
      balanceThresholdNano: n.balanceThresholdNano,
      enabled: n.enabled,
      balanceBelow: false,
      createdAt: Math.floor(this.now() / 1000),
    }
    await this.store.insertWebhook(webhook)
    await this.refresh()
    return { webhook, secret }
  }

  list(org: LiveOrg): Promise<WebhookRecord[]> {
    return this.store.listWebhooks(org.id)
  }

  async get(org: LiveOrg, id: string): Promise<WebhookRecord> {
    const w = await this.store.getWebhook(id)
    if (!w || w.orgId !== org.id) throw notFound(id)
    return w
  }

  async update(org: LiveOrg, id: string, c: WebhookChanges): Promise<WebhookRecord> {
    const w = await this.get(org, id)
    const events = c.events ?? w.events
    const threshold = c.balanceThresholdNano !== undefined ? c.balanceThresholdNano : w.balanceThresholdNano
    checkEvents(events, threshold)
    const updated = await this.store.updateWebhook(id, {
      ...(c.url !== undefined && { url: webhookUrl(c.url, this.allowPrivateUrls) }),
      ...(c.events !== undefined && { events: [...new Set(c.events)] }),
      ...(c.balanceThresholdNano !== undefined && { balanceThresholdNano: c.balanceThresholdNano }),
      ...(c.enabled !== undefined && { enabled: c.enabled }),
      // A new threshold is watched afresh: below it now, the alert is sent once more.
      ...(c.balanceThresholdNano !== undefined &&
        c.balanceThresholdNano !== w.balanceThresholdNano && { balanceBelow: false }),
    })
    if (!updated) throw notFound(id)
    await this.refresh()
    return updated
  }

  async delete(org: LiveOrg, id: string): Promise<void> {
    await this.get(org, id)
    await this.store.deleteWebhook(id)
    this.below.delete(id)
    await this.refresh()
  }

  async deliveries(org: LiveOrg, id: string, limit: number) {
    await this.get(org, id)
    return this.store.listWebhookEvents(id, limit)
  }

  // Alerts.

  watches(orgId: string): boolean {
    return this.spendOrgs.has(orgId)
  }

  charged(key: LiveKey, org: LiveOrg, f: SpendFigures): void {
    const hooks = this.byOrg.get(org.id)
    if (!hooks) return
    if (key.limitNano !== null)
      this.allowance(
        key,
        org,
        {
          kind: 'limit',
          amountNano: key.limitNano,
          spentNano: f.keySpentAtMostNano,
          scope: String(key.limitNano),
        },
        f.exact && (async () => (await f.exact!()).keySpentNano),
      )
    this.balance(org, hooks, f)
  }

  limitRefused(key: LiveKey, org: LiveOrg): void {
    if (key.limitNano === null) return
    this.refused(key, org, {
      kind: 'limit',
      amountNano: key.limitNano,
      spentNano: key.spentNano,
      scope: String(key.limitNano),
    })
  }

  /**
   * After a charge under a key's period budget: key.budget_80 and key.budget_100 once per period
   * (scope: the period's start and the amount), with the period in the event's data.
   */
  budgetCharged(key: LiveKey, org: LiveOrg, b: BudgetFigures): void {
    if (!this.spendOrgs.has(org.id)) return
    this.allowance(key, org, budgetAllowance(key, b, b.spentAtMostNano), b.exact)
  }

  /** A request refused for a key's budget (402 key_budget_exhausted): key.budget_100. */
  budgetRefused(key: LiveKey, org: LiveOrg, b: BudgetFigures): void {
    if (!this.spendOrgs.has(org.id)) return
    this.refused(key, org, budgetAllowance(key, b, b.spentAtMostNano))
  }

  /** A batch reached a final status: batch.completed, batch.failed or batch.expired. */
  async batchFinished(b: BatchRecord): Promise<void> {
    if (b.status !== 'completed' && b.status !== 'failed' && b.status !== 'expired') return
    const type = `batch.${b.status}` as const
    const hooks = this.byOrg.get(b.orgId)?.filter((h) => h.events.includes(type))
    if (!hooks?.length) return
    const id = eventId(`${type}:${b.id}`)
    const at = this.now()
    const payload = eventPayload(id, type, b.orgId, at, {
      batch_id: b.id,
      status: b.status,
      request_counts: { total: b.total, completed: b.completed, failed: b.failed },
      output_file_id: b.outputFileId,
      error_file_id: b.errorFileId,
      cost_rub: nanoToRubNumber(b.costNano),
    })
    await this.store.enqueueWebhookEvents(
      hooks.map((h) => ({ webhookId: h.id, eventId: id, orgId: b.orgId, type, payload, createdAtMs: at })),
    )
  }

  /** 80% and 100% of a limit or budget: an event each, once per scope. */
  private allowance(key: LiveKey, org: LiveOrg, a: KeyAllowance, exact?: () => Promise<NanoRub>) {
    if (a.amountNano <= 0n) return
    // Cheapest first: the comparison, then what was sent, then whether a webhook wants it.
    const due = LEVELS.filter(
      (pct) =>
        a.spentNano * 100n >= a.amountNano * BigInt(pct) &&
        !this.fired.has(firedKey(key, a, pct)) &&
        this.wanted(org, a, pct),
    )
    if (due.length === 0) return
    if (this.fired.size > FIRED_MAX) this.fired.clear()
    for (const pct of due) this.fired.add(firedKey(key, a, pct))
    this.serially(
      org.id,
      async () => {
        const spent = exact ? await exact() : a.spentNano
        const reached = due.filter((pct) => spent * 100n >= a.amountNano * BigInt(pct))
        for (const pct of due) if (!reached.includes(pct)) this.fired.delete(firedKey(key, a, pct))
        await this.writeAllowance(key, org, { ...a, spentNano: spent }, reached, 'spent')
      },
      () => {
        for (const pct of due) this.fired.delete(firedKey(key, a, pct))
      },
    )
  }

  private refused(key: LiveKey, org: LiveOrg, a: KeyAllowance) {
    const fired = firedKey(key, a, 100)
    if (this.fired.has(fired) || !this.wanted(org, a, 100)) return
    if (this.fired.size > FIRED_MAX) this.fired.clear()
    this.fired.add(fired)
    this.serially(
      org.id,
      () => this.writeAllowance(key, org, a, [100], 'refused'),
      () => this.fired.delete(fired),
    )
  }

  private wanted(org: LiveOrg, a: KeyAllowance, pct: number): boolean {
    const type = `key.${a.kind}_${pct}`
    return this.byOrg.get(org.id)?.some((h) => h.events.includes(type)) === true
  }

  private allowanceId(key: LiveKey, a: KeyAllowance, pct: number): string {
    return eventId(`key.${firedKey(key, a, pct)}`)
  }

  private async writeAllowance(
    key: LiveKey,
    org: LiveOrg,
    a: KeyAllowance,
    levels: readonly number[],
    reason: 'spent' | 'refused',
  ) {
    const at = this.now()
    const rows: NewWebhookEvent[] = []
    for (const pct of levels) {
      const type = `key.${a.kind}_${pct}` as WebhookEventType
      const hooks = this.byOrg.get(org.id)?.filter((h) => h.events.includes(type)) ?? []
      const id = this.allowanceId(key, a, pct)
      const payload = eventPayload(id, type, org.id, at, {
        key_id: key.id,
        key_name: key.name,
        [`${a.kind}_rub`]: nanoToRubNumber(a.amountNano),
        spent_rub: nanoToRubNumber(a.spentNano),
        threshold_percent: pct,
        // spent: the spend reached the level; refused: a request was refused for it (402).
        reason,
        ...a.data,
      })
      for (const h of hooks)
        rows.push({ webhookId: h.id, eventId: id, orgId: org.id, type, payload, createdAtMs: at })
    }
    await this.store.enqueueWebhookEvents(rows)
  }

  /**
   * balance.below_threshold: sent once when the balance drops below a webhook's threshold, and
   * again only after it was back at or above it (a credit). The store's compare-and-set on the
   * webhook's balance_below picks one node to write the event.
   */
  private balance(org: LiveOrg, hooks: readonly WebhookRecord[], f: SpendFigures) {
    const watched = hooks.filter(
      (h) => h.balanceThresholdNano !== null && h.events.includes('balance.below_threshold'),
    )
    if (watched.length === 0) return
    const dips: WebhookRecord[] = []
    for (const h of watched) {
      const threshold = h.balanceThresholdNano!
      const below = this.below.get(h.id) === true
      if (below && f.balanceAtLeastNano >= threshold) {
        // Back above (a credit): armed again. The bound is safe: the balance is at least it.
        this.below.set(h.id, false)
        this.serially(org.id, async () => void (await this.store.setWebhookBalanceBelow(h.id, false)))
      } else if (!below && f.balanceAtLeastNano < threshold) dips.push(h)
    }
    if (dips.length === 0) return
    for (const h of dips) this.below.set(h.id, true)
    this.serially(
      org.id,
      async () => {
        const balance = f.exact ? (await f.exact()).balanceNano : f.balanceAtLeastNano
        for (const h of dips) {
          if (balance >= h.balanceThresholdNano!) {
            this.below.set(h.id, false)
            continue
          }
          const at = this.now()
          // Unique per drop: the compare-and-set, not the id, keeps a drop to one event.
          const id = eventId(`balance.below_threshold:${h.id}:${at}:${randomBase62(8)}`)
          const payload = eventPayload(id, 'balance.below_threshold', org.id, at, {
            balance_rub: nanoToRubNumber(balance),
            threshold_rub: nanoToRubNumber(h.balanceThresholdNano!),
          })
          await this.store.setWebhookBalanceBelow(h.id, true, {
            webhookId: h.id,
            eventId: id,
            orgId: org.id,
            type: 'balance.below_threshold',
            payload,
            createdAtMs: at,
          })
        }
      },
      () => {
        for (const h of dips) this.below.set(h.id, false)
      },
    )
  }

  /** Runs alert work for an organization after the work before it; a failure is logged and undone. */
  private serially(orgId: string, work: () => Promise<void>, undo?: () => void) {
    const before = this.chains.get(orgId) ?? Promise.resolve()
    const next = before.then(work).catch((err) => {
      undo?.()
      this.log('error', 'writing a webhook event failed; the next charge tries again', {
        org: orgId,
        error: String(err),
      })
    })
    this.chains.set(orgId, next)
    void next.then(() => {
      if (this.chains.get(orgId) === next) this.chains.delete(orgId)
    })
  }

  /** Alert work still running (a test or a graceful stop waits for it). */
  async settled(): Promise<void> {
    await Promise.all([...this.chains.values()])
  }
}

/** What a key's event at a level is about: `<kind>_<pct>:<key id>:<scope>`. */
function firedKey(key: LiveKey, a: KeyAllowance, pct: number): string {
  return `${a.kind}_${pct}:${key.id}:${a.scope}`
}

function checkEvents(events: readonly string[], thresholdNano: NanoRub | null) {
  if (events.length === 0) throw new InvalidValue('events must name at least one event type', 'events')
  if (events.includes('balance.below_threshold') && thresholdNano === null)
    throw new InvalidValue(
      'balance.below_threshold needs balance_threshold_rub (the balance below which it is sent)',
      'balance_threshold_rub',
    )
}

/** A period budget as an allowance: its stretch is the period (start and amount). */
function budgetAllowance(key: LiveKey, b: BudgetFigures, spentNano: NanoRub): KeyAllowance {
  return {
    kind: 'budget',
    amountNano: b.amountNano,
    spentNano,
    scope: `${b.span.startMs}:${b.amountNano}`,
    data: {
      period: key.budget?.period ?? null,
      timezone: key.budget?.timezone ?? null,
      period_start: Math.floor(b.span.startMs / 1000),
      resets_at: Math.ceil(b.span.endMs / 1000),
    },
  }
}
