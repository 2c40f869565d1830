import type { ConcurrencyLimiter, Slot } from '../billing/concurrency.ts'
import { LedgerWriter } from '../billing/ledger.ts'
import type {
  BudgetNow,
  MoneyMeter,
  Reservation,
  Settlement,
  SpendWatch,
  Standing,
} from '../billing/meter.ts'
import type { NanoRub } from '../billing/money.ts'
import { hasRateLimits, type RateLimiter } from '../billing/rate-limiter.ts'
import type { ClusterBus, ClusterEvent } from '../cluster/bus.ts'
import { type RateLimited, SharedStateUnavailable } from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { BatchView } from './nodes.ts'
import { decodeError, type EncodedError, Outbox, type ToPrimary, type ToWorker } from './protocol.ts'

/**
 * A worker's channel to its primary: `call` asks and waits for the answer, `tell` sends and goes
 * on. Messages leave in the order they are sent and the primary handles them in that order, so a
 * settlement told before a request is admitted is counted before it.
 */
export class PrimaryLink {
  private seq = 0
  private readonly waiting = new Map<number, { ok: (v: unknown) => void; fail: (e: Error) => void }>()
  private eventHandler: ((ev: ToWorker & { ev: unknown }) => void) | undefined
  private viewHandler: ((view: BatchView) => void) | undefined
  /** The primary's latest view, kept until a handler takes it (it may come before the services are up). */
  private view: BatchView | undefined
  /** What this worker answers when the primary asks (its metrics' text). */
  metricsHere: (() => Promise<string>) | undefined
  gone = false
  private readonly out: Outbox<ToPrimary>

  constructor(send: (batch: ToPrimary[]) => void) {
    this.out = new Outbox(send)
  }

  /** Called with each batch of messages from the primary. */
  receiveAll(batch: readonly ToWorker[]): void {
    for (const m of batch) this.receive(m)
  }

  private receive(m: ToWorker): void {
    if ('ev' in m) {
      this.eventHandler?.(m)
      return
    }
    if ('bv' in m) {
      if (this.viewHandler) this.viewHandler(m.bv)
      else this.view = m.bv
      return
    }
    if ('ask' in m) {
      const q = m.q
      void (this.metricsHere?.() ?? Promise.resolve('')).then(
        (text) => this.tell('answer', q, text),
        () => this.tell('answer', q, ''),
      )
      return
    }
    const w = this.waiting.get(m.c)
    if (!w) return
    this.waiting.delete(m.c)
    if ('err' in m) w.fail(decodeError(m.err as EncodedError))
    else w.ok(m.ok)
  }

  onEvent(h: (m: ToWorker & { ev: unknown }) => void): void {
    this.eventHandler = h
  }

  /** The primary's views of the batch's nodes (src/workers/nodes.ts), the latest one at once. */
  onBatchView(h: (view: BatchView) => void): void {
    this.viewHandler = h
    if (this.view) h(this.view)
    this.view = undefined
  }

  /** The primary is gone: whatever waits fails (the worker exits right after). */
  lost(): void {
    this.gone = true
    for (const w of this.waiting.values()) w.fail(new SharedStateUnavailable())
    this.waiting.clear()
  }

  call<T>(op: string, ...a: unknown[]): Promise<T> {
    if (this.gone) return Promise.reject(new SharedStateUnavailable())
    const c = ++this.seq
    return new Promise<T>((ok, fail) => {
      this.waiting.set(c, { ok: ok as (v: unknown) => void, fail })
      this.out.push({ c, op, a })
    })
  }

  tell(op: string, ...a: unknown[]): void {
    if (!this.gone) this.out.push({ op, a })
  }
}

interface RemoteReservation extends Reservation {
  /** The primary's number for it. */
  rid?: number
}

/**
 * Money admitted by the primary (one Meter for every worker, so limits and balances hold as in one
 * process): one round trip per request to reserve, a telling to settle or release. The charge is
 * computed here the same way the primary computes it (the real cost, never above the
 * reservation), so the answer carries it without waiting. What a worker shows (balances, spend,
 * budgets) it asks the primary (`standing`, `budgetNow`).
 */
export class RemoteMeter implements MoneyMeter {
  watch: SpendWatch | undefined
  constructor(
    private readonly link: PrimaryLink,
    readonly clock: () => number = Date.now,
  ) {}

  reserve(key: LiveKey, org: LiveOrg, amountNano: NanoRub, endUser?: string): Promise<Reservation> {
    return this.link.call<number>('reserve', key.id, org.id, amountNano, endUser).then((rid): Reservation => {
      const r: RemoteReservation = { key, org, amountNano, done: false, rid }
      key.reservedNano += amountNano
      org.reservedNano += amountNano
      return r
    })
  }

  settle(r: RemoteReservation, s: Settlement): NanoRub {
    if (r.done) return 0n
    r.done = true
    r.key.reservedNano -= r.amountNano
    r.org.reservedNano -= r.amountNano
    const cost = s.costNano < 0n ? 0n : s.costNano
    const charged = cost > r.amountNano ? r.amountNano : cost
    // This worker's copies, for what they show without asking (the primary's are the truth).
    r.key.spentNano += charged
    r.org.balanceNano -= charged
    r.key.lastUsedAt = Math.floor(s.endedAtMs / 1000)
    this.link.tell('settle', r.rid, s)
    return charged
  }

  release(r: RemoteReservation): void {
    if (r.done) return
    r.done = true
    r.key.reservedNano -= r.amountNano
    r.org.reservedNano -= r.amountNano
    this.link.tell('release', r.rid)
  }

  limitChanged(key: LiveKey, _before: NanoRub | null, after: NanoRub | null): void {
    this.link.tell('limitChanged', key.id, after)
  }

  async standing(org: LiveOrg, keys: readonly LiveKey[]): Promise<Standing> {
    const s = await this.link.call<{
      balanceNano: NanoRub
      reservedNano: NanoRub
      spent: [string, NanoRub][]
    }>(
      'standing',
      org.id,
      keys.map((k) => k.id),
    )
    return { balanceNano: s.balanceNano, reservedNano: s.reservedNano, spentNano: new Map(s.spent) }
  }

  budgetNow(key: LiveKey, endUser?: string): Promise<BudgetNow | undefined> {
    if ((endUser === undefined ? key.budget : key.endUserBudget) === null) return Promise.resolve(undefined)
    return this.link.call<BudgetNow | undefined>('budgetNow', key.id, endUser)
  }
}

/** Rate limits counted by the primary; asked only for keys and organizations that have some. */
export class RemoteRateLimiter implements RateLimiter {
  constructor(private readonly link: PrimaryLink) {}

  admit(key: LiveKey, org: LiveOrg, modelId: string, promptTokens: number): Promise<void> | undefined {
    // Nothing to count (two field checks): no round trip.
    if (!hasRateLimits(key, org)) return undefined
    return this.link.call<void>('admit', key.id, org.id, modelId, promptTokens)
  }

  used(key: LiveKey, org: LiveOrg, modelId: string, completionTokens: number): void {
    if (hasRateLimits(key, org)) this.link.tell('used', key.id, org.id, modelId, completionTokens)
  }

  async refusal(
    key: LiveKey,
    org: LiveOrg,
    modelId: string,
    promptTokens: number,
  ): Promise<RateLimited | null> {
    const e = await this.link.call<EncodedError | null>('refusal', key.id, org.id, modelId, promptTokens)
    return e === null ? null : (decodeError(e) as RateLimited)
  }

  close(): void {}
}

/** Keys' max_concurrency counted by the primary. */
export class RemoteConcurrency implements ConcurrencyLimiter {
  constructor(private readonly link: PrimaryLink) {}

  async acquire(key: LiveKey): Promise<Slot> {
    const sid = await this.link.call<number>('acquire', key.id)
    let held = true
    return {
      release: () => {
        if (!held) return
        held = false
        this.link.tell('slotRelease', sid)
      },
    }
  }

  inFlight(key: LiveKey): Promise<number> {
    return this.link.call<number>('inFlight', key.id)
  }

  close(): void {}
}

/**
 * The bus between workers, through the primary: revocations and key changes reach every other
 * worker and the primary, and publishAndConfirm answers once each has applied the event. Healthy
 * while the primary is there (a worker whose primary is gone exits).
 */
export class IpcBus implements ClusterBus {
  private handler: ((e: ClusterEvent) => unknown) | undefined
  private readonly handlers = new Map<ClusterEvent['t'], (e: ClusterEvent) => unknown>()
  private readonly since = Date.now()

  constructor(
    private readonly link: PrimaryLink,
    readonly nodeId: string,
  ) {
    link.onEvent(({ ev }) => {
      const e = ev as unknown as ClusterEvent & { msg: string }
      const ack = () => this.link.tell('ack', e.msg)
      const own = this.handlers.get(e.t)
      let done: unknown
      try {
        done = own ? own(e) : this.handler?.(e)
      } catch {}
      if (done instanceof Promise) done.then(ack, ack)
      else ack()
    })
  }

  async publish(e: ClusterEvent): Promise<void> {
    this.link.tell('publish', e)
  }

  publishAndConfirm(e: ClusterEvent, timeoutMs: number): Promise<boolean> {
    return this.link.call<boolean>('publishConfirm', e, timeoutMs).catch(() => false)
  }

  async subscribe(handler: (e: ClusterEvent) => unknown): Promise<void> {
    this.handler = handler
  }

  on(t: ClusterEvent['t'], handler: (e: ClusterEvent) => unknown): void {
    this.handlers.set(t, handler)
  }

  healthy(): boolean {
    return !this.link.gone
  }

  listeningSinceMs(): number {
    return this.since
  }

  async close(): Promise<void> {}
}

/**
 * A worker's ledger: its settlements are written by the primary, so a flush (before reading the
 * ledger back: usage, activity) is the primary's.
 */
export class PrimaryLedger extends LedgerWriter {
  constructor(private readonly link: PrimaryLink) {
    super({ writeRows: async () => {} }, 1_000_000, () => {})
  }

  override flush(): Promise<void> {
    return this.link.call<void>('flush')
  }

  override start(): void {}

  /**
   * At a worker's stop: once the primary answers, it has every settlement sent before (the channel
   * keeps order) and has written them.
   */
  override async stop(): Promise<void> {
    await this.flush().catch(() => {})
  }
}
