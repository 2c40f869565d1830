import type { ConcurrencyLimiter, Slot } from '../billing/concurrency.ts'
import type { LedgerWriter } from '../billing/ledger.ts'
import type { MoneyMeter, Reservation, Settlement } from '../billing/meter.ts'
import type { NanoRub } from '../billing/money.ts'
import type { RateLimiter } from '../billing/rate-limiter.ts'
import type { ClusterBus, ClusterEvent } from '../cluster/bus.ts'
import { SharedStateUnavailable } from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { IdentityService } from '../identity/service.ts'
import type { NodeReport, PrimaryNodes } from './nodes.ts'
import { encodeError, Outbox, type ToPrimary, type ToWorker } from './protocol.ts'

/** One worker as the primary sees it: how to send to it, and what it holds. */
interface WorkerEnd {
  readonly send: (m: ToWorker) => void
  readonly holds: Map<number, Reservation>
  readonly slots: Map<number, Slot>
}

/**
 * The primary's bus: events of the primary (and of each worker, relayed) go to every worker but
 * the sender; publishAndConfirm waits for each of them, and the primary's own handler, to apply.
 */
export class HubBus implements ClusterBus {
  readonly nodeId = 'primary'
  private seq = 0
  private handler: ((e: ClusterEvent) => unknown) | undefined
  private readonly handlers = new Map<ClusterEvent['t'], (e: ClusterEvent) => unknown>()
  readonly workers = new Map<number, WorkerEnd>()
  /** Acknowledgements awaited, by message. */
  private readonly waiting = new Map<string, { left: Set<number>; done: () => void }>()

  async subscribe(handler: (e: ClusterEvent) => unknown): Promise<void> {
    this.handler = handler
  }

  on(t: ClusterEvent['t'], handler: (e: ClusterEvent) => unknown): void {
    this.handlers.set(t, handler)
  }

  healthy(): boolean {
    return true
  }

  listeningSinceMs(): number {
    return 0
  }

  async close(): Promise<void> {}

  async publish(e: ClusterEvent): Promise<void> {
    void this.relay(e, -1, 0)
  }

  publishAndConfirm(e: ClusterEvent, timeoutMs: number): Promise<boolean> {
    return this.relay(e, -1, timeoutMs)
  }

  /** The primary's own handler of an event from a worker; resolves once it has applied it. */
  private async applyHere(e: ClusterEvent): Promise<void> {
    const own = this.handlers.get(e.t)
    await (own ? own(e) : this.handler?.(e))
  }

  /**
   * Sends an event to every worker but `from` (and applies it here when it came from a worker);
   * with a timeout, resolves true once all have acknowledged, false when the time ran out.
   */
  relay(e: ClusterEvent, from: number, timeoutMs: number): Promise<boolean> {
    const msg = `p:${++this.seq}`
    const left = new Set<number>()
    for (const [id, w] of this.workers) {
      if (id === from) continue
      left.add(id)
      w.send({ ev: { ...e, msg } })
    }
    const here = from >= 0 ? this.applyHere(e).catch(() => {}) : Promise.resolve()
    if (timeoutMs <= 0) return Promise.resolve(true)
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => finish(false), timeoutMs)
      let acked = false
      const finish = (ok: boolean) => {
        clearTimeout(timer)
        this.waiting.delete(msg)
        resolve(ok)
      }
      const check = () => {
        if (acked && left.size === 0) finish(true)
      }
      this.waiting.set(msg, { left, done: check })
      void here.then(() => {
        acked = true
        check()
      })
    })
  }

  acked(worker: number, msg: string): void {
    const w = this.waiting.get(msg)
    if (!w) return
    w.left.delete(worker)
    w.done()
  }

  /** A worker is gone: it acknowledges nothing more. */
  forget(worker: number): void {
    this.workers.delete(worker)
    for (const w of this.waiting.values()) {
      w.left.delete(worker)
      w.done()
    }
  }
}

/**
 * What the primary does for its workers: the one Meter, rate limiter and concurrency count of the
 * process group (so a key's limit, an organization's balance, a minute's requests hold across
 * workers as they do in one process), the ledger's flush, credits, and the bus's relay. Each
 * worker's holds and slots are kept by worker, so a worker that dies gives them back.
 */
export class Hub {
  private nextId = 0
  /** Questions to workers awaiting their answers, by number. */
  private readonly asked = new Map<number, (worker: number, answer: unknown) => void>()

  constructor(
    private readonly identity: IdentityService,
    private readonly meter: MoneyMeter,
    private readonly limiter: RateLimiter,
    private readonly concurrency: ConcurrencyLimiter,
    private readonly ledger: LedgerWriter,
    readonly bus: HubBus,
    /** The primary's own metrics' text (its ledger, batches, the nodes its batches use). */
    private readonly metricsHere: () => Promise<string>,
    /** The batch's nodes and the workers' interactive requests on them (src/workers/nodes.ts). */
    private readonly nodes?: PrimaryNodes,
  ) {}

  /** Every process's metrics: the primary's and each worker's that answers within 2 s. */
  private async gatherMetrics(): Promise<{ worker: string; text: string }[]> {
    const q = ++this.nextId
    const answers: { worker: string; text: string }[] = []
    const waiting = new Set(this.bus.workers.keys())
    const all = new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 2000)
      this.asked.set(q, (worker, text) => {
        if (!waiting.delete(worker)) return
        answers.push({ worker: String(worker), text: String(text) })
        if (waiting.size === 0) {
          clearTimeout(timer)
          resolve()
        }
      })
      if (waiting.size === 0) {
        clearTimeout(timer)
        resolve()
      }
    })
    for (const w of this.bus.workers.values()) w.send({ q, ask: 'metrics' })
    const here = await this.metricsHere().catch(() => '')
    await all
    this.asked.delete(q)
    answers.sort((a, b) => Number(a.worker) - Number(b.worker))
    return [{ worker: 'primary', text: here }, ...answers]
  }

  /** `send` takes a batch of messages (src/workers/protocol.ts Outbox). */
  attach(worker: number, send: (batch: ToWorker[]) => void): void {
    const out = new Outbox(send)
    this.bus.workers.set(worker, { send: (m) => out.push(m), holds: new Map(), slots: new Map() })
    if (this.nodes) out.push({ bv: this.nodes.latest() })
  }

  /** A worker exited: its requests died with it, so their holds and slots come back (unbilled). */
  detach(worker: number): { holds: number; slots: number } {
    const w = this.bus.workers.get(worker)
    this.bus.forget(worker)
    this.nodes?.forget(worker)
    if (!w) return { holds: 0, slots: 0 }
    for (const r of w.holds.values()) this.meter.release(r)
    for (const s of w.slots.values()) s.release()
    return { holds: w.holds.size, slots: w.slots.size }
  }

  receiveAll(worker: number, batch: readonly ToPrimary[]): void {
    for (const m of batch) this.receive(worker, m)
  }

  private receive(worker: number, m: ToPrimary): void {
    if ('ready' in m) return
    const w = this.bus.workers.get(worker)
    if (!w) return
    const { c, op, a } = m
    let out: unknown
    try {
      out = this.run(worker, w, op, a)
    } catch (err) {
      if (c !== undefined) w.send({ c, err: encodeError(err) })
      return
    }
    if (c === undefined) {
      if (out instanceof Promise) out.catch(() => {})
      return
    }
    if (out instanceof Promise)
      out.then(
        (ok) => w.send({ c, ok }),
        (err) => w.send({ c, err: encodeError(err) }),
      )
    else w.send({ c, ok: out })
  }

  private key(id: string): LiveKey | Promise<LiveKey> {
    const k = this.identity.keyOrLoad(id)
    const sure = (x: LiveKey | undefined) => {
      if (!x) throw new SharedStateUnavailable()
      return x
    }
    return k instanceof Promise ? k.then(sure) : k
  }

  private org(id: string): LiveOrg | Promise<LiveOrg> {
    const o = this.identity.orgOrLoad(id)
    const sure = (x: LiveOrg | undefined) => {
      if (!x) throw new SharedStateUnavailable()
      return x
    }
    return o instanceof Promise ? o.then(sure) : o
  }

  /** Both, synchronously when both are in memory (the hot path), else once read. */
  private pair<T>(keyId: string, orgId: string, f: (k: LiveKey, o: LiveOrg) => T): T | Promise<Awaited<T>> {
    const k = this.key(keyId)
    const o = this.org(orgId)
    if (k instanceof Promise || o instanceof Promise)
      return Promise.all([k, o]).then(([k2, o2]) => f(k2, o2) as Awaited<T>)
    return f(k, o)
  }

  private run(worker: number, w: WorkerEnd, op: string, a: readonly unknown[]): unknown {
    switch (op) {
      case 'reserve': {
        const [keyId, orgId, amount, endUser] = a as [string, string, NanoRub, string | undefined]
        const keep = (r: Reservation) => {
          // The worker may have died while this waited (its number may be a new worker's by now): then
          // nothing holds it.
          if (this.bus.workers.get(worker) !== w) {
            this.meter.release(r)
            throw new SharedStateUnavailable()
          }
          const rid = ++this.nextId
          w.holds.set(rid, r)
          return rid
        }
        const r = this.pair(keyId, orgId, (k, o) => this.meter.reserve(k, o, amount, endUser))
        if (r instanceof Promise) return r.then(keep)
        return keep(r)
      }
      case 'nodes': {
        this.nodes?.report(worker, a[0] as NodeReport[])
        return
      }
      case 'settle': {
        const [rid, s] = a as [number, Settlement]
        const r = w.holds.get(rid)
        if (!r) return
        w.holds.delete(rid)
        this.meter.settle(r, s)
        return
      }
      case 'release': {
        const r = w.holds.get(a[0] as number)
        if (!r) return
        w.holds.delete(a[0] as number)
        this.meter.release(r)
        return
      }
      case 'limitChanged': {
        const [keyId, after] = a as [string, NanoRub | null]
        const k = this.identity.keyById(keyId)
        if (k) k.limitNano = after
        return
      }
      case 'standing': {
        const [orgId, keyIds] = a as [string, string[]]
        const o = this.org(orgId)
        const answer = (org: LiveOrg) => ({
          balanceNano: org.balanceNano,
          reservedNano: org.reservedNano,
          // A key this process never charged has its store record's spend, which the worker has.
          spent: keyIds.flatMap((id) => {
            const k = this.identity.keyById(id)
            return k ? [[id, k.spentNano] as [string, NanoRub]] : []
          }),
        })
        return o instanceof Promise ? o.then(answer) : answer(o)
      }
      case 'budgetNow': {
        const [keyId, endUser] = a as [string, string | undefined]
        const k = this.key(keyId)
        return k instanceof Promise
          ? k.then((x) => this.meter.budgetNow(x, endUser))
          : this.meter.budgetNow(k, endUser)
      }
      case 'credit': {
        const [orgId, amount, reason] = a as [string, NanoRub, string | null]
        const o = this.org(orgId)
        return o instanceof Promise
          ? o.then((x) => this.identity.credit(x, amount, reason))
          : this.identity.credit(o, amount, reason)
      }
      case 'flush':
        return this.ledger.flush()
      case 'admit': {
        const [keyId, orgId, model, tokens] = a as [string, string, string, number]
        return this.pair(keyId, orgId, (k, o) => this.limiter.admit(k, o, model, tokens))
      }
      case 'used': {
        const [keyId, orgId, model, tokens] = a as [string, string, string, number]
        const k = this.identity.keyById(keyId)
        const o = k && this.identity.orgOrLoad(orgId)
        if (k && o && !(o instanceof Promise)) this.limiter.used(k, o, model, tokens)
        return
      }
      case 'refusal': {
        const [keyId, orgId, model, tokens] = a as [string, string, string, number]
        return this.pair(keyId, orgId, (k, o) => this.limiter.refusal(k, o, model, tokens)).then((e) =>
          e === null ? null : encodeError(e),
        )
      }
      case 'acquire': {
        const k = this.key(a[0] as string)
        const keep = (s: Slot) => {
          if (this.bus.workers.get(worker) !== w) {
            s.release()
            throw new SharedStateUnavailable()
          }
          const sid = ++this.nextId
          w.slots.set(sid, s)
          return sid
        }
        const take = (x: LiveKey) => {
          const s = this.concurrency.acquire(x)
          return s instanceof Promise ? s.then(keep) : keep(s)
        }
        return k instanceof Promise ? k.then(take) : take(k)
      }
      case 'slotRelease': {
        const s = w.slots.get(a[0] as number)
        w.slots.delete(a[0] as number)
        s?.release()
        return
      }
      case 'inFlight': {
        const k = this.key(a[0] as string)
        return k instanceof Promise
          ? k.then((x) => this.concurrency.inFlight(x))
          : this.concurrency.inFlight(k)
      }
      case 'publish':
        return void this.bus.relay(a[0] as ClusterEvent, worker, 0)
      case 'publishConfirm':
        return this.bus.relay(a[0] as ClusterEvent, worker, a[1] as number)
      case 'ack':
        return this.bus.acked(worker, a[0] as string)
      case 'metrics':
        return this.gatherMetrics()
      case 'answer':
        return this.asked.get(a[0] as number)?.(worker, a[1])
      case 'reloaded':
        return // the primary's process handler reloads (src/workers/primary.ts)
      default:
        throw new Error(`unknown operation ${op}`)
    }
  }
}
