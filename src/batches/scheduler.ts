import type { LedgerWriter } from '../billing/ledger.ts'
import type { MoneyMeter, Reservation } from '../billing/meter.ts'
import { batchCostNano, costNano, formatRub } from '../billing/money.ts'
import type { Config, ModelConfig, Price } from '../config/load.ts'
import { SharedStateUnavailable } from '../errors.ts'
import type { LiveKey } from '../identity/live.ts'
import type { IdentityService } from '../identity/service.ts'
import { requestId } from '../ids.ts'
import type { Log } from '../log.ts'
import type { Candidate, NodePool, NodeState } from '../routing/nodes.ts'
import type { BatchRecord, BatchStatus, Store } from '../storage/store.ts'
import type { RequestTrace } from '../tracing/span.ts'
import type { Tracing } from '../tracing/tracing.ts'
import { Demand, ValleyEntry } from './demand.ts'
import type { AdmitReply, FromWorker, ToWorker, WorkerInit } from './protocol.ts'

/** A finalization claimed longer ago than this is taken over by another node (or after a restart). */
const FINALIZE_STALE_S = 30
/** The statuses a batch has until it is finished. */
const UNFINISHED: readonly BatchStatus[] = ['validating', 'in_progress', 'finalizing', 'cancelling']

/** How fast the fleet's interactive load, as batch admission reads it, follows a fall. */
const LOAD_FALL_MS = 500

export interface BatchSettings {
  readonly workers: number
  /** Share of each node's max_concurrency batch lines leave free on a node with no interactive traffic. */
  readonly interactiveReserve: number
  /**
   * Slots of every node batch lines leave free whatever the shares say (at least one line still
   * runs on a node of one slot): an interactive request arriving at a node full of lines starts
   * at the engine's next iteration, without waiting for the lines' cancellation to reach it.
   */
  readonly reserveSlots: number
  /**
   * Share of each node's max_concurrency batch lines may keep while interactive traffic is active
   * there; lines beyond it are pre-empted when an interactive request starts on the node.
   */
  readonly busyShare: number
  /** A node counts as free of interactive traffic once none has been in flight there for this long. */
  readonly quietMs: number
  /**
   * Interactive requests in flight over the fleet's slots (as they are now, not followed slowly
   * as `interactiveLoad` falls) at or under which lines start on every node beside interactive
   * traffic, `reserveSlots` (at least one) kept free for the next arrival, in a valley
   * (`inValley`); or the half-second demand at or under half of it. They keep their places while
   * `interactiveLoad`, or the demand over a second, is at most max(2 x fillLoad, quietLoad). 0: off.
   */
  readonly fillLoad: number
  /** The load over which even a quiet node takes no line (a peak's lulls are no valley). */
  readonly quietLoad: number
  /**
   * Packing (0: off): at or under `quietLoad`, interactive traffic keeps to as few nodes as hold
   * it at this share of their slots, and the batch has the others whole
   * (`plan`).
   */
  readonly packShare: number
  readonly tickMs: number
  readonly workerUrl?: string | URL | undefined
  /** The receipt key a line's ledger row records (an export signs the row with it); none when receipts are off. */
  readonly receiptKid?: (() => string | undefined) | undefined
  /**
   * Told of every worker and tick error first; true when it was a full disk, already reported
   * once (the job fails again every tick until space is freed: logging each would fill the disk
   * further).
   */
  readonly reportDiskFull?: (err: unknown) => boolean
  /** Traces each line (tracing on): a span per line, continued upstream. */
  readonly tracing?: Tracing | undefined
  /**
   * Told of a batch this node brought to a final status (completed, failed, expired, cancelled),
   * once it is written: webhooks' batch events.
   */
  readonly finished?: (b: BatchRecord) => Promise<void>
}

/**
 * The longest an arriving request looks back for lines just sent to its node (`preemptOn`). A
 * decoding step is 20-100 ms on today's engines; a longer estimate is mostly long prompts'
 * prefill (a line's time over its tokens counts its prefill too), and lines sent that long ago
 * may be prefilling already: cancelling them would throw that work away.
 */
const MAX_FRESH_MS = 250

/** A node's batch timing (`Scheduler.lineTiming`). */
interface LineTiming {
  startedAtMs: number
  lineMs: number | undefined
  stepMs: number | undefined
}

interface Admitted {
  /** The receipt key of the line's ledger row (the worker writes it with the result). */
  readonly receiptKid: string | null
  readonly reservation: Reservation
  readonly candidate: Candidate
  readonly batchId: string
  readonly line: number
  readonly model: string
  /** The model's price when the line was admitted (a reload changes it for later lines only). */
  readonly price: Price
  readonly startedAtMs: number
  /** Pre-empted for interactive traffic: its node slot is already given back. */
  preempted: boolean
  /** The line's trace (tracing on): one span from admission to settlement. */
  readonly trace?: RequestTrace
}

/**
 * The main-thread half of batch execution: it owns every state transition, and it is the only
 * place batch lines get a node and a reservation (so money and routing stay single-threaded
 * while worker threads do the parsing, upstream calls and file writing).
 */
export class BatchScheduler {
  private readonly workers: Worker[] = []
  /** Lines holding a node slot and a reservation, per worker and its request number. */
  private readonly admitted = new Map<Worker, Map<number, Admitted>>()
  private readonly busy = new Set<string>() // batches with a validation or finalization under way
  /** Finalizations this node claimed and handed to a worker: the claim's stamp, per batch. */
  private readonly claims = new Map<string, number>()
  /** Batches whose failed finalization already had its claim given back once. */
  private readonly releasedOnce = new Set<string>()
  private timer: ReturnType<typeof setInterval> | undefined
  private turn = 0

  constructor(
    private readonly store: Store,
    private readonly identity: IdentityService,
    private readonly meter: MoneyMeter,
    private readonly ledger: LedgerWriter,
    private readonly pool: NodePool,
    private readonly config: Config,
    private readonly settings: BatchSettings,
    private readonly log: Log,
  ) {
    this.models = new Map(config.models.map((m) => [m.id, m]))
  }

  private init: WorkerInit | undefined

  /** Starts the tick; worker threads start with the first batch there is to work on. */
  start(init: WorkerInit): void {
    this.init = init
    this.pool.onInteractive = (node) => this.preemptOn(node, true)
    this.pool.onInteractiveChange = (nowMs) => this.plan(nowMs)
    // One router owns a SQLite file: lines leased when it last stopped (or was killed) go back
    // to the queue now. On PostgreSQL other nodes may hold leases; a dead node's expire.
    if (this.config.storage.kind === 'sqlite')
      void this.store
        .releaseAllLeases()
        .then((n) => {
          if (n > 0) this.log('info', 'batch lines returned to the queue after a restart', { lines: n })
        })
        // A full disk (or a locked file) at start must not take the process down: the leases
        // then run out by themselves.
        .catch((err) => this.log('error', 'returning leased batch lines failed', { error: String(err) }))
    this.timer = setInterval(() => this.tickSoon(), this.settings.tickMs)
  }

  private ensureWorkers() {
    if (this.workers.length > 0 || !this.init) return
    const init = this.init
    for (let i = 0; i < this.settings.workers; i++) {
      // A second entry point of the compiled executable (see the build script); main.ts names it,
      // since inside the executable only a path relative to the entry point finds it.
      const w = new Worker(this.settings.workerUrl ?? new URL('./worker.ts', import.meta.url))
      w.onmessage = (ev: MessageEvent<FromWorker>) => this.onMessage(w, ev.data)
      w.onerror = (ev) => this.log('error', 'batch worker error', { error: String(ev.message) })
      w.postMessage({ t: 'init', init })
      this.workers.push(w)
      this.admitted.set(w, new Map())
    }
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer)
    if (this.wakeTimer) clearTimeout(this.wakeTimer)
    for (const w of this.workers) {
      w.postMessage({ t: 'stop' } satisfies ToWorker)
      w.terminate()
    }
    this.workers.length = 0
    const returned: Promise<void>[] = []
    for (const lines of this.admitted.values()) {
      for (const a of lines.values()) {
        this.meter.release(a.reservation)
        if (!a.preempted) this.pool.preemptBatch(a.candidate.node)
        // Its lease goes back now, so another node (or this one restarted) takes it at once.
        returned.push(
          this.store
            .retryLine(a.batchId, a.line, 0, true)
            .catch((err) => this.log('error', 'returning a batch line failed', { error: String(err) })),
        )
      }
    }
    this.admitted.clear()
    await Promise.all(returned)
  }

  private draining = false
  private lastAdmitAtMs = 0
  private models: Map<string, ModelConfig>

  /** A reloaded config's models, for lines admitted from now on (here and in the workers). */
  useModels(models: readonly ModelConfig[]): void {
    this.models = new Map(models.map((m) => [m.id, m]))
    this.slots = undefined
    if (this.init) this.init = { ...this.init, models }
    for (const w of this.workers) w.postMessage({ t: 'models', models } satisfies ToWorker)
  }

  /**
   * A graceful stop's first half: no new validation, finalization or line; lines leased but not
   * started go back to the queue; lines running finish, until `untilMs`. stop() then gives back
   * the leases of those still running.
   */
  async drain(untilMs: number): Promise<void> {
    this.draining = true
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
    for (const w of this.workers) w.postMessage({ t: 'stop' } satisfies ToWorker)
    for (const q of this.queued.splice(0))
      q.w.postMessage({ t: 'admitted', reqId: q.m.reqId, reply: { kind: 'wait', ms: 0 } } satisfies ToWorker)
    // Until the running lines settle and no leased line asked for a slot for a moment (each such
    // ask is answered 'wait', and the worker gives its lease back).
    const running = () => [...this.admitted.values()].some((lines) => lines.size > 0)
    while (Date.now() < untilMs && (running() || Date.now() - this.lastAdmitAtMs < 200)) await Bun.sleep(20)
  }

  private ticking = false
  private tickErrorAtMs = 0
  /** When the last tick found no batch to move; idle, the store is asked once a second, not every tick. */
  private idleSinceMs = 0
  private nudged = false

  /** Wakes the scheduler now (a new batch, a cancel) instead of at the next tick. */
  nudge(): void {
    this.nudged = true
    this.tickSoon()
  }

  private tickSoon(): void {
    if (this.ticking) return
    if (!this.nudged && this.idleSinceMs > 0 && Date.now() - this.idleSinceMs < 1000) return
    this.nudged = false
    this.ticking = true
    this.tick()
      .catch((err) => {
        this.settings.reportDiskFull?.(err)
        // While the store is away every tick fails: say so once every few seconds, not each time.
        const now = Date.now()
        if (now - this.tickErrorAtMs < 5000) return
        this.tickErrorAtMs = now
        this.log('error', 'batch tick failed', { error: String(err).slice(0, 300) })
      })
      .finally(() => {
        this.ticking = false
      })
  }

  private send(m: ToWorker) {
    const w = this.workers[this.turn++ % this.workers.length]
    w?.postMessage(m)
  }

  /** Moves batches along: validate, notice the end, expire, finish a cancel. */
  private async tick() {
    const now = Math.floor(Date.now() / 1000)
    this.drainQueue() // nodes may have freed up without a batch line ending (interactive traffic left)
    const active = await this.store.batchesInStatus(['validating', 'in_progress', 'cancelling', 'finalizing'])
    this.wanting = this.queued.length > 0 || active.some((b) => b.status === 'in_progress')
    this.plan(Date.now())
    this.idleSinceMs = active.length === 0 ? this.idleSinceMs || Date.now() : 0
    if (this.idleSinceMs > 0 && Date.now() - this.idleSinceMs >= 1000) this.idleSinceMs = Date.now()
    if (active.length > 0) this.ensureWorkers()
    for (const b of active) {
      // Admission reads this cache; refreshing it here keeps it warm for every running batch.
      this.running.set(b.id, {
        keyId: b.keyId,
        orgId: b.orgId,
        checkedAtMs: Date.now(),
        ok: b.status === 'in_progress',
      })
      if (this.busy.has(b.id)) continue
      if (b.status === 'finalizing') {
        // A finalization that a restart interrupted: do it again (it is idempotent).
        await this.finalize(b, 'completed')
        continue
      }
      if (b.status === 'validating') {
        this.busy.add(b.id)
        this.send({ t: 'validate', batchId: b.id, keyModels: this.identity.keyById(b.keyId)?.models ?? null })
        continue
      }
      if (b.status === 'in_progress' && this.identity.keyById(b.keyId)?.status === 'revoked') {
        // A revoked key never comes back: fail what is left now rather than at expiry.
        this.failBatchSoon(b.id, 'key_revoked', 'the API key was revoked')
        continue
      }
      if (b.status === 'in_progress' && now >= b.expiresAt) {
        await this.store.failOpenLines(b.id, (l) =>
          errorLine(l.customId, 'batch_expired', 'the batch expired before this line ran'),
        )
        await this.finalize(b, 'expired')
        continue
      }
      if (b.status === 'cancelling') {
        await this.store.failOpenLines(
          b.id,
          (l) => errorLine(l.customId, 'batch_cancelled', 'the batch was cancelled before this line ran'),
          true,
        )
      }
      if ((await this.store.openLineCount(b.id)) === 0)
        // A batch another node is failing (money ran out, key revoked) has its error recorded.
        await this.finalize(b, b.status === 'cancelling' ? 'cancelled' : b.errors ? 'failed' : 'completed')
      else this.logProgress(b)
    }
  }

  private readonly lastProgressLog = new Map<string, number>()

  /** A progress line per running batch every few seconds, for operators reading the log. */
  private logProgress(b: BatchRecord) {
    const now = Date.now()
    if (now - (this.lastProgressLog.get(b.id) ?? 0) < 5000) return
    this.lastProgressLog.set(b.id, now)
    this.log('info', 'batch progress', {
      batch: b.id,
      status: b.status,
      total: b.total,
      completed: b.completed,
      failed: b.failed,
    })
  }

  /**
   * Finalizes a batch whose lines are all done. With several nodes on one store each may see
   * that at once: the store hands the finalization to one of them (a claim stamped in
   * `finalizing_at` by the store's clock, so the nodes' own clocks do not matter); another node
   * takes it over only once the claim is older than FINALIZE_STALE_S (its node died writing the
   * files).
   */
  private async finalize(b: BatchRecord, status: 'completed' | 'expired' | 'cancelled' | 'failed') {
    this.busy.add(b.id)
    try {
      // The batch's cost is the sum of its ledger rows: write the queued ones first.
      await this.ledger.flush()
      const claimed = await this.store.claimFinalize(
        b.id,
        [b.status],
        { status: status === 'completed' ? 'finalizing' : b.status },
        FINALIZE_STALE_S,
      )
      if (claimed === undefined) {
        this.busy.delete(b.id)
        return
      }
      this.claims.set(b.id, claimed)
    } catch (err) {
      this.busy.delete(b.id)
      throw err
    }
    this.send({ t: 'finalize', batchId: b.id, status })
  }

  /**
   * A worker failed to write a batch this node claimed: give the claim back, so that the next
   * tick (here or on another node) tries again at once instead of after FINALIZE_STALE_S (once
   * per batch). Only our own claim is cleared (its exact stamp): another stamp belongs to a node
   * that took over meanwhile.
   */
  private async releaseClaim(batchId: string, stampedAt: number) {
    await this.store
      .releaseFinalize(batchId, UNFINISHED, stampedAt)
      .catch((err) =>
        this.log('error', 'batch finalization claim not released', { batch: batchId, error: String(err) }),
      )
  }

  private onMessage(w: Worker, m: FromWorker) {
    switch (m.t) {
      case 'validated':
        void this.validated(m).catch((err) =>
          this.log('error', 'batch validation failed', { error: String(err) }),
        )
        return
      case 'admit': {
        this.lastAdmitAtMs = Date.now()
        if (this.draining) {
          w.postMessage({ t: 'admitted', reqId: m.reqId, reply: { kind: 'wait', ms: 0 } } satisfies ToWorker)
          return
        }
        // No node has room now: the line waits here, first in first out, for the next free slot
        // (a settle frees one), instead of going back to the queue with a delay.
        const pending = this.admit(w, m)
        if (pending)
          void pending.then((reply) =>
            w.postMessage({ t: 'admitted', reqId: m.reqId, reply } satisfies ToWorker),
          )
        else this.queued.push({ w, m, sinceMs: Date.now() })
        return
      }
      case 'settle':
        this.settle(w, m)
        return
      case 'finalized':
        this.busy.delete(m.batchId)
        this.claims.delete(m.batchId)
        this.releasedOnce.delete(m.batchId)
        this.log('info', 'batch finished', { batch: m.batchId })
        this.announce(m.batchId)
        return
      case 'error':
        // The job is tried again at the next tick.
        if (m.batchId) {
          const batchId = m.batchId
          const claim = this.claims.get(batchId)
          this.claims.delete(batchId)
          // A failed finalization gives its claim back once, before the batch counts as free, so
          // the next tick's claim succeeds; if it fails again the claim stands for the stale
          // window (a lasting fault is not retried every tick).
          if (claim !== undefined && !this.releasedOnce.has(batchId)) {
            this.releasedOnce.add(batchId)
            void this.releaseClaim(batchId, claim).finally(() => this.busy.delete(batchId))
          } else this.busy.delete(batchId)
        }
        this.log(this.settings.reportDiskFull?.(m.message) ? 'debug' : 'error', 'batch worker', {
          batch: m.batchId,
          error: m.message,
        })
        return
    }
  }

  private readonly queued: { w: Worker; m: Extract<FromWorker, { t: 'admit' }>; sinceMs: number }[] = []

  /**
   * How long a line waits here for a node before it goes back to the table: through a peak of
   * interactive traffic lines wait rather than being leased, read and priced again every few
   * seconds (work the interactive traffic's CPU pays for), but well within their lease.
   */
  private queueWaitMs(): number {
    return Math.min(30_000, (this.init?.leaseMs ?? 10_000) / 2)
  }

  /** Tells `finished` of a batch's final status (read back from the store). */
  private announce(batchId: string) {
    const finished = this.settings.finished
    if (!finished) return
    void this.store
      .getBatch(batchId)
      .then((b) => b && finished(b))
      .catch((err) =>
        this.log('error', 'announcing a finished batch failed', { batch: batchId, error: String(err) }),
      )
  }

  /** Admits waiting lines while there is room; a line that waited too long goes back to its worker. */
  private drainQueue() {
    const now = Date.now()
    while (this.queued.length > 0) {
      const q = this.queued[0]!
      const pending =
        this.admit(q.w, q.m) ??
        (now - q.sinceMs > this.queueWaitMs()
          ? Promise.resolve<AdmitReply>({ kind: 'wait', ms: 100 })
          : undefined)
      if (!pending) return
      this.queued.shift()
      void pending.then((reply) =>
        q.w.postMessage({ t: 'admitted', reqId: q.m.reqId, reply } satisfies ToWorker),
      )
    }
  }

  private async validated(m: Extract<FromWorker, { t: 'validated' }>) {
    this.busy.delete(m.batchId)
    const b = await this.store.getBatch(m.batchId)
    if (b?.status !== 'validating') return
    const now = Math.floor(Date.now() / 1000)
    const fail = (
      errors: readonly { code: string; line: number | null; message: string; param: string | null }[],
    ) =>
      this.store.updateBatch(
        b.id,
        { status: 'failed', failedAt: now, errors: JSON.stringify({ object: 'list', data: errors }) },
        ['validating'],
      )
    if (m.errors.length > 0) {
      if (await fail(m.errors)) this.announce(b.id)
      return
    }
    // Enough money for the whole file at its worst case, now: the key's remaining limit and the balance.
    const key = this.identity.keyById(b.keyId)
    const org = this.identity.org(b.orgId)
    const keyRoom = key?.limitNano == null ? null : key.limitNano - key.spentNano - key.reservedNano
    const orgRoom = org.balanceNano - org.reservedNano
    if ((keyRoom !== null && m.estimateNano > keyRoom) || m.estimateNano > orgRoom) {
      const which =
        keyRoom !== null && m.estimateNano > keyRoom ? 'key_limit_reached' : 'insufficient_balance'
      const failed = await fail([
        {
          code: which,
          line: null,
          param: null,
          message: `the batch may cost up to ${m.estimateNano} nano-roubles at the batch price, more than is left`,
        },
      ])
      if (failed) this.announce(b.id)
      return
    }
    if (
      await this.store.updateBatch(b.id, { status: 'in_progress', inProgressAt: now, total: m.total }, [
        'validating',
      ])
    )
      this.running.set(b.id, { keyId: b.keyId, orgId: b.orgId, checkedAtMs: Date.now(), ok: true })
  }

  /**
   * A line goes only to a node that is the batch's (`batchCap`: given it by the packing plan,
   * or with packing off free of interactive traffic for `quietMs`), up to its max_concurrency
   * less the interactive reserve; on a node serving
   * interactive requests, batch lines keep at most `busyShare` of it (none by default). Sharing
   * a node costs interactive users: a batch line's prefill lengthens the iteration their first
   * token waits for, and every running sequence slows each decode step. An interactive request
   * that starts on a node pre-empts the lines there (`preemptOn`), so batches never hold a slot
   * interactive traffic needs, and the routing policy prefers nodes already serving interactive
   * traffic (routing/predicted.ts `batchHeldFactor`, `batchNodeFactor`), so that at low load
   * whole nodes stay free for the batch. The node is picked (and its slot taken) synchronously; then the money is
   * reserved, which may wait on Redis in a cluster. undefined: no node has room now.
   */
  private admit(w: Worker, m: Extract<FromWorker, { t: 'admit' }>): Promise<AdmitReply> | undefined {
    const b = this.batchInfo(m.batchId)
    if (!b || this.failing.has(m.batchId)) return Promise.resolve({ kind: 'stop', code: 'batch_not_running' })
    const key = this.identity.keyById(b.keyId)
    if (key?.status !== 'active') return Promise.resolve({ kind: 'stop', code: 'key_not_active' })
    const now = Date.now()
    // While interactive requests are in flight anywhere, lines start on a node spaced out (`pace`).
    const paced = this.interactiveLoad(now) * this.countSlots() >= 0.5
    let best: Candidate | undefined
    let nextAtMs = Number.POSITIVE_INFINITY
    for (const c of this.pool.candidates(m.model)) {
      const cap = this.batchCap(c, now)
      if (
        !c.node.available(now) ||
        c.node.inFlight + c.node.remoteInteractive >= c.route.maxConcurrency ||
        c.node.batchInFlight >= cap
      )
        continue
      if (paced) {
        const at = this.pace(c.node, cap)
        if (at > now) {
          nextAtMs = Math.min(nextAtMs, at)
          continue
        }
      }
      if (!best || c.node.batchInFlight / c.route.weight < best.node.batchInFlight / best.route.weight)
        best = c
    }
    if (!best) {
      if (nextAtMs < Number.POSITIVE_INFINITY) this.wakeAt(nextAtMs)
      return undefined
    }
    const node = best
    this.pool.beginBatch(node.node, m.promptTokens, now)
    this.lineTiming(node.node).startedAtMs = now
    // A batch's first lines may run before the tick that reads its status: the plan (and what
    // routing is told) must know of it from its first line, or a load rising before that tick
    // would leave its lines running on nodes no interactive request landed on.
    if (!this.wanting) {
      this.wanting = true
      this.plan(now)
    }
    return this.fund(w, m, key, b.orgId, node, now)
  }

  /**
   * Per node: when its last line started, how long its lines took, and the time between their
   * tokens (the engine's step there, with the lines in it): moving averages.
   */
  private readonly timing = new WeakMap<NodeState, LineTiming>()

  private lineTiming(node: NodeState): LineTiming {
    let t = this.timing.get(node)
    if (!t) {
      t = { startedAtMs: Number.NEGATIVE_INFINITY, lineMs: undefined, stepMs: undefined }
      this.timing.set(node, t)
    }
    return t
  }

  /**
   * When the node may start its next line beside interactive traffic: its lines spaced by half
   * of what keeping `cap` of them running needs (a line's time over `cap`), so they start about
   * one at a time. Started together, their prefills fill the engine's iterations back to back,
   * and an interactive request arriving then waits behind all of them (in bench/batch-yield.ts's
   * valleys, TTFT p99 86 -> 508 ms with filling unpaced). The same spacing follows an interactive
   * request's start there, so that a line's prefill does not join its first iteration. Before a
   * line has finished on the node, no spacing.
   */
  private pace(node: NodeState, cap: number): number {
    const t = this.lineTiming(node)
    if (t.lineMs === undefined) return Number.NEGATIVE_INFINITY
    return Math.max(t.startedAtMs, node.lastInteractiveStartMs) + t.lineMs / Math.max(1, cap) / 2
  }

  private wakeTimer: ReturnType<typeof setTimeout> | undefined
  private wakeAtMs = Number.POSITIVE_INFINITY

  /** Admits waiting lines again at `atMs` (a paced node's next start). */
  private wakeAt(atMs: number): void {
    if (this.wakeTimer && this.wakeAtMs <= atMs) return
    if (this.wakeTimer) clearTimeout(this.wakeTimer)
    this.wakeAtMs = atMs
    this.wakeTimer = setTimeout(
      () => {
        this.wakeTimer = undefined
        this.wakeAtMs = Number.POSITIVE_INFINITY
        this.drainQueue()
      },
      Math.max(1, atMs - Date.now()),
    )
  }

  /**
   * How many batch lines the node may run now. While the packing plan decides (`plan`), a node
   * it gives the batch takes its share (at least one line, however small its max_concurrency)
   * once its last interactive request ended. With packing off, a quiet node takes its share
   * unless the fleet is busy (its lulls are short: a line started there would meet the next
   * request). In a valley of the fleet's load, every node takes
   * lines beside its interactive requests, keeping one slot free for the next (pre-emption frees
   * more when more come). Otherwise lines keep `busyShare` of a node serving interactive traffic.
   */
  private batchCap(c: Candidate, nowMs: number, keeping = false): number {
    const slots = c.route.maxConcurrency
    const share = Math.max(
      1,
      Math.min(
        Math.floor(slots * (1 - this.settings.interactiveReserve)),
        slots - this.settings.reserveSlots,
      ),
    )
    const load = this.interactiveLoad(nowMs)
    // Rising from idle (`risingUntilMs`): a node an interactive request starts on keeps no line.
    if (keeping && nowMs < this.risingUntilMs) return 0
    if (this.packing) {
      // The plan says which nodes are the batch's: one of them fills once its last interactive
      // request ended; the nodes kept for interactive traffic take no line while it holds.
      if (c.node.batchHeld && c.node.interactiveEverywhere === 0) return share
    } else if (c.node.quiet(nowMs, this.settings.quietMs) && load <= this.settings.quietLoad) return share
    // Filling starts at or under fillLoad. Lines running keep their places while the load, or the
    // demand over a whole second, is at most twice that (or quietLoad): the lines themselves slow
    // the valley's requests (each decode step runs theirs too), so the same arrivals keep more
    // requests in flight (in bench/batch-yield.ts's valleys about 0.12 of the slots with lines,
    // 0.07 without), and at a bound of 0.15 one cluster of arrivals pre-empted every line.
    const fill = this.settings.fillLoad
    let fills = false
    if (fill > 0 && (keeping || nowMs >= this.risingUntilMs)) {
      const fleet = this.countSlots()
      const keep = Math.max(2 * fill, this.settings.quietLoad)
      const second = this.demand.load(nowMs, fleet, 1000)
      const half = this.demand.load(nowMs, fleet)
      // Right after a peak the load and the demand over a second still read the peak's requests
      // (draining, and arrived within the second), where the half second reads the valley.
      const afterPeak = this.entry.afterPeak(nowMs, second)
      const kept = load <= keep || (second ?? 1) <= keep || (afterPeak && (half ?? 1) <= keep)
      if (keeping) {
        fills = kept
        // An arrival beside lines reads the valley too: it holds while lines keep their places.
        if (!kept) this.valley = false
        else if (this.valley) this.valleyAtMs = nowMs
      } else
        fills =
          this.inValley(nowMs, second, half, kept, afterPeak) &&
          (this.inFlightLoad() <= fill || (half ?? 1) <= fill / (afterPeak ? 1 : 2))
    }
    if (fills)
      return Math.max(
        0,
        Math.min(share, slots - c.node.interactiveEverywhere - Math.max(1, this.settings.reserveSlots)),
      )
    return Math.min(Math.floor(slots * this.settings.busyShare), slots - c.node.interactiveEverywhere)
  }

  /**
   * Whether the fleet is in a valley lines may start in (`second`, `half`: the demand over the
   * last second and half second, undefined until known; `kept`: the bound lines keep their places
   * under holds). Entered as `ValleyEntry` says (demand.ts: after a peak, the half-second demand
   * at most `fillLoad`; otherwise the demand over a second at most half of it for half a second);
   * left when lines would be pre-empted (`kept` fails, read here or by an arrival beside lines),
   * when the fleet rises from idle, or when nothing read it for a second. Within a valley, a line
   * starts while the requests in flight are at most `fillLoad` or the half-second demand at most
   * half of it (right after a peak: at most `fillLoad`, as it entered). Without the valley, those
   * two alone read lulls of the 50% load as valleys: the requests in flight there average 0.19 of
   * the slots and dip under 0.1 for a few hundred milliseconds, and half a second holds one or two
   * arrivals now and then (in bench/batch-yield.ts's 50% runs, lines started and were pre-empted
   * within a second now and then, TTFT p99 1.12-1.24x). Left at a demand over `fillLoad`, a valley
   * was left every few seconds (valleys 0.53-0.70 of the idle rate): the lines slow the valley's
   * requests, so the same arrivals read as more demand. Until the demand is known (20 arrivals,
   * decayed over about 10 s, and 2 s since the first), the requests in flight alone decide and
   * no valley is entered.
   */
  private inValley(
    nowMs: number,
    second: number | undefined,
    half: number | undefined,
    kept: boolean,
    afterPeak: boolean,
  ): boolean {
    const fill = this.settings.fillLoad
    // A valley is one only while it is followed: read last over a second ago, it is entered anew.
    if (nowMs - this.valleyAtMs > 1000) {
      this.valley = false
      this.entry.forget()
    }
    this.valleyAtMs = nowMs
    // Too few arrivals yet to know their time in flight (a light load, or a fresh start): the
    // requests in flight alone decide, for now; a valley is entered only on a known demand.
    if (second === undefined || half === undefined) {
      this.valley = false
      this.entry.forget()
      return this.inFlightLoad() <= fill
    }
    const enters = this.entry.enters(nowMs, second, half, fill, afterPeak)
    this.valley = this.valley ? kept : enters
    return this.valley
  }

  private valley = false
  private valleyAtMs = Number.NEGATIVE_INFINITY
  private readonly entry = new ValleyEntry()

  /** Every node's max_concurrency summed (a node of several models at its largest); undefined: to count. */
  private slots: number | undefined
  /** Each node's max_concurrency (of several models, the largest), by base URL. */
  private nodeSlots = new Map<string, number>()
  private load = 0
  private loadAtMs = 0

  /**
   * The fleet's interactive load: interactive requests in flight over the fleet's slots, followed
   * at once when it rises and over about LOAD_FALL_MS when it falls, so a valley counts as one
   * only once the load has stayed low for a moment.
   */
  interactiveLoad(nowMs: number): number {
    const inFlight = this.interactiveInFlight()
    this.demand.observe(nowMs, inFlight)
    if (inFlight === 0) this.fleetIdleSinceMs ??= nowMs
    else if (this.fleetIdleSinceMs !== undefined) {
      // The first request after the fleet was idle for quietMs: the start of a rise, perhaps.
      if (nowMs - this.fleetIdleSinceMs >= this.settings.quietMs) {
        this.risingUntilMs = nowMs + this.settings.quietMs
        // Whatever the fleet was in before it went idle, a valley is entered anew.
        this.valley = false
      }
      this.fleetIdleSinceMs = undefined
    }
    const now = inFlight / this.countSlots()
    // Read again within the same millisecond, a rise shows at once (a fall waits for time to pass).
    const dt = Math.max(0, nowMs - this.loadAtMs)
    this.loadAtMs = nowMs
    this.load = now >= this.load ? now : now + (this.load - now) * Math.exp(-dt / LOAD_FALL_MS)
    return this.load
  }

  private readonly demand = new Demand()
  /** Since when no interactive request has been in flight on the fleet (undefined: some are). */
  private fleetIdleSinceMs: number | undefined
  /**
   * Until when the interactive requests that start clear their node of batch lines, and no line
   * starts beside interactive traffic: for quietMs after the first request to reach a fleet idle
   * for quietMs (`interactiveLoad`). It may be a lone request, or the start of a load that the
   * load and the demand show only after a few hundred milliseconds; meanwhile its first requests
   * would run beside a node full of lines (at 50% load, TTFT 36 -> ~90 ms for the first second's
   * requests, a p99 of 1.14x the run without a batch). A lone request costs the batch one node's
   * lines and a second of filling.
   */
  private risingUntilMs = Number.NEGATIVE_INFINITY

  /** The fleet's interactive demand (`Demand`), NaN until known: for /metrics. */
  interactiveDemand(nowMs: number): number {
    this.interactiveLoad(nowMs)
    return this.demand.load(nowMs, this.countSlots()) ?? Number.NaN
  }

  /** Interactive requests in flight over the fleet's slots now (not followed slowly as it falls). */
  private inFlightLoad(): number {
    return this.interactiveInFlight() / this.countSlots()
  }

  /** Interactive requests in flight on the fleet now (every router's, as the nodes' counts have them). */
  private interactiveInFlight(): number {
    let inFlight = 0
    for (const n of this.pool.nodes.values()) inFlight += n.interactiveEverywhere
    return inFlight
  }

  private countSlots(): number {
    if (this.slots !== undefined) return this.slots
    const byNode = new Map<string, number>()
    for (const m of this.models.values())
      for (const r of m.routes) byNode.set(r.baseUrl, Math.max(byNode.get(r.baseUrl) ?? 0, r.maxConcurrency))
    this.nodeSlots = byNode
    this.slots = Math.max(
      1,
      [...byNode.values()].reduce((a, b) => a + b, 0),
    )
    return this.slots
  }

  /** A batch is running or has lines waiting for a node (set every tick, and by a first line). */
  get wantsNodes(): boolean {
    return this.wanting
  }

  /** Whether the packing plan decides which nodes are the batch's (see `plan`). */
  private packing = false
  /** A batch is running or has lines waiting for a node (set every tick). */
  private wanting = false

  /**
   * The packing plan, brought up to date at every interactive start and end and every tick. While
   * a batch runs and the fleet's interactive load is at most `quietLoad`, interactive traffic is
   * given as few nodes as hold it at `packShare` of their slots (the load is followed at once as
   * it rises, slowly as it falls); the other nodes are the batch's whole
   * (`NodeState.batchHeld`), and the routing policy sends interactive requests there only when
   * the kept nodes are full or much slower. Kept first: the nodes serving most interactive
   * requests, then those not the batch's already, then those running the fewest lines. A node
   * the batch gives back has its lines pre-empted at once, before interactive traffic needs it;
   * over `quietLoad` every node is given back. A node stays the batch's until the load needs it
   * whole, and is given to it only once the load fits in the others with a quarter to spare, so
   * that a load near a boundary does not move a node back and forth.
   */
  private plan(nowMs: number): void {
    this.planNodes(nowMs)
    this.pool.onBatchState?.()
  }

  private planNodes(nowMs: number): void {
    const nodes = this.pool.nodes.values()
    const load = this.interactiveLoad(nowMs)
    // A node can be the batch's only while the fleet's load is at most quietLoad. Over it, a
    // batch changes nothing for interactive traffic: routing is told of no batch (no node is
    // priced up to stay free for it), and the lines still running anywhere over what their node
    // may keep beside interactive traffic are pre-empted now, as the load rises, rather than when
    // a request lands on their node and waits for their iteration.
    const may = this.wanting && load <= this.settings.quietLoad
    // Routing is told (batchQuietMs) only while a batch may have a node.
    const had = this.pool.batchQuietMs !== undefined
    this.pool.batchQuietMs = may ? this.settings.quietMs : undefined
    if (had && !may && !this.packing)
      for (const n of this.pool.nodes.values()) if (n.batchInFlight > 0) this.preemptOn(n)
    if (this.settings.packShare <= 0 || !may) {
      if (!this.packing) return
      this.packing = false
      for (const n of nodes) this.giveBack(n)
      return
    }
    this.packing = true
    // Interactive requests in flight, as the load follows them; under half a request (the last
    // ended a moment ago), none: every node is the batch's, and the next request takes one back.
    const demand = load * this.countSlots()
    let room = demand < 0.5 ? Number.POSITIVE_INFINITY : 0
    const order = [...nodes].sort(
      (a, b) =>
        Number(b.available(nowMs)) - Number(a.available(nowMs)) ||
        b.interactiveEverywhere - a.interactiveEverywhere ||
        Number(a.batchHeld) - Number(b.batchHeld) ||
        a.batchInFlight - b.batchInFlight ||
        (a.name < b.name ? -1 : a.name > b.name ? 1 : 0),
    )
    for (const n of order) {
      // A node out of service (its breaker open) is neither: no line goes there either.
      if (!n.available(nowMs)) {
        n.batchHeld = false
        continue
      }
      const want = n.batchHeld ? demand : demand * 1.25
      if (room < want) {
        room += (this.nodeSlots.get(n.baseUrl) ?? 0) * this.settings.packShare
        this.giveBack(n)
      } else n.batchHeld = true
    }
  }

  /** The batch gives a node back to interactive traffic: its lines over what it may keep are pre-empted now. */
  private giveBack(n: NodeState): void {
    if (!n.batchHeld) return
    n.batchHeld = false
    if (n.batchInFlight > 0) this.preemptOn(n)
  }

  /** Nodes the packing plan gives the batch now (for /metrics). */
  heldNodes(): number {
    let n = 0
    for (const x of this.pool.nodes.values()) if (x.batchHeld) n++
    return n
  }

  /**
   * An interactive request started on a node running batch lines (`arriving`), or the node is
   * given back to interactive traffic: the lines over what the node may keep beside interactive
   * traffic are cancelled upstream, newest first (the least work lost), and go back to the queue
   * to run elsewhere or later. A pre-empted run is not billed and costs the line no attempt; only
   * the run that completes is billed, once.
   *
   * An arriving request also cancels the lines that reached the node within its engine's last
   * step (a line's time there over its steps, `settle`): their prefill has likely not run yet, so
   * it would run in the request's first step and lengthen it by a whole prompt's prefill (in
   * bench/batch-yield.ts's valleys, a line's 512 tokens: 26 ms on top of a step of 40-60 ms; the
   * valleys' requests over the without runs' TTFT p99 fell from 11-29 to 8-14 on four seeds).
   * Such a line has done little or no work; it goes back to the queue like any pre-empted one.
   */
  private preemptOn(node: NodeState, arriving = false): void {
    const lines: { w: Worker; reqId: number; a: Admitted }[] = []
    for (const [w, admitted] of this.admitted)
      for (const [reqId, a] of admitted)
        if (a.candidate.node === node && !a.preempted) lines.push({ w, reqId, a })
    if (lines.length === 0) return
    const now = Date.now()
    let over = node.batchInFlight - this.batchCap(lines[0]!.a.candidate, now, true)
    const stepMs = arriving ? this.lineTiming(node).stepMs : undefined
    const freshSinceMs =
      stepMs === undefined ? Number.POSITIVE_INFINITY : now - Math.min(stepMs, MAX_FRESH_MS)
    lines.sort((x, y) => y.a.startedAtMs - x.a.startedAtMs)
    for (const l of lines) {
      if (over <= 0 && l.a.startedAtMs <= freshSinceMs) break
      over--
      l.a.preempted = true
      this.pool.preemptBatch(node)
      this.preempted++
      l.w.postMessage({ t: 'preempt', reqId: l.reqId } satisfies ToWorker)
    }
  }

  /** Batch lines pre-empted by interactive traffic so far (for /metrics). */
  preempted = 0

  private async fund(
    w: Worker,
    m: Extract<FromWorker, { t: 'admit' }>,
    key: LiveKey,
    orgId: string,
    best: Candidate,
    now: number,
  ): Promise<AdmitReply> {
    let reservation: Reservation
    try {
      reservation = await this.meter.reserve(key, this.identity.org(orgId), m.worstNano)
    } catch (err) {
      this.pool.unsentBatch(best.node, now, m.promptTokens)
      if (err instanceof SharedStateUnavailable) return { kind: 'wait', ms: 500 }
      // Out of money mid-batch: the batch fails, keeping what finished.
      this.failBatchSoon(m.batchId, 'insufficient_quota', 'the money ran out')
      return { kind: 'stop', code: 'insufficient_quota' }
    }
    const model = this.models.get(m.model)
    const traced = this.settings.tracing?.line({
      'gen_ai.operation.name': model?.kind === 'embedding' ? 'embeddings' : 'chat',
      'gen_ai.request.model': m.model,
      'gen_ai.provider.name': best.route.provider,
      'tropa.request_id': `${m.batchId}-${m.line}`,
      'tropa.batch_id': m.batchId,
      'tropa.batch_line': m.line,
      'tropa.key_id': key.id,
      'tropa.org_id': orgId,
      'tropa.node': best.node.name,
    })
    const receiptKid = this.settings.receiptKid?.() ?? null
    this.admitted.get(w)?.set(m.reqId, {
      receiptKid,
      reservation,
      candidate: best,
      batchId: m.batchId,
      line: m.line,
      model: m.model,
      price: model?.price ?? { promptNano: 0n, completionNano: 0n, cachedPromptNano: 0n },
      startedAtMs: now,
      preempted: false,
      ...(traced && { trace: traced.trace }),
    })
    return {
      kind: 'go',
      node: best.node.name,
      baseUrl: best.route.baseUrl,
      upstreamModel: best.route.upstreamModel,
      apiKey: best.route.apiKey,
      ...(traced && { traceparent: traced.traceparent }),
      receiptKid,
    }
  }

  private settle(w: Worker, m: Extract<FromWorker, { t: 'settle' }>) {
    const lines = this.admitted.get(w)
    const a = lines?.get(m.reqId)
    if (!a) return
    lines!.delete(m.reqId)
    if (!a.preempted) this.pool.endBatch(a.candidate.node, m.nodeOk)
    queueMicrotask(() => this.drainQueue())
    if (m.usage && !a.preempted) {
      const t = this.lineTiming(a.candidate.node)
      const ms = Date.now() - a.startedAtMs
      t.lineMs = t.lineMs === undefined ? ms : t.lineMs + (ms - t.lineMs) * 0.2
      // A chat line is answered whole (not streamed): its time over its engine steps (a prefill
      // step, then one a token after the first) is about one step there.
      const tokens = m.usage.completionTokens
      if (tokens > 1) {
        const step = ms / (tokens + 1)
        t.stepMs = t.stepMs === undefined ? step : t.stepMs + (step - t.stepMs) * 0.2
      }
    }
    if (!m.usage) {
      this.meter.release(a.reservation)
      // Not billed: pre-empted (it runs again, in a trace of its own) or failed (maybe retried).
      a.trace?.end(
        { 'tropa.outcome': a.preempted ? 'preempted' : m.outcome },
        a.preempted ? undefined : { message: m.outcome, code: m.outcome },
      )
      return
    }
    const charged = this.meter.settle(a.reservation, {
      requestId: `${a.batchId}-${a.line}`,
      model: a.model,
      node: a.candidate.node.name,
      promptTokens: m.usage.promptTokens,
      completionTokens: m.usage.completionTokens,
      costNano: batchCostNano(
        costNano(m.usage.promptTokens, m.usage.completionTokens, a.price, m.usage.cachedTokens ?? 0),
      ),
      batchId: a.batchId,
      startedAtMs: a.startedAtMs,
      endedAtMs: Date.now(),
      outcome: m.outcome,
      estimated: false,
      cachedTokens: m.usage.cachedTokens,
      ttftMs: m.usage.ttftMs,
      receiptKid: a.receiptKid,
    })
    if (a.trace) {
      a.trace.child('settle').end()
      a.trace.end({
        'gen_ai.response.model': a.model,
        'gen_ai.usage.input_tokens': m.usage.promptTokens,
        'gen_ai.usage.output_tokens': m.usage.completionTokens,
        'tropa.cost_rub': formatRub(charged),
        'tropa.outcome': m.outcome,
      })
    }
  }

  private readonly running = new Map<
    string,
    { keyId: string; orgId: string; checkedAtMs: number; ok: boolean }
  >()

  /** Batch owner and whether it is running, cached for a moment (admission is per line). */
  private batchInfo(batchId: string) {
    const c = this.running.get(batchId)
    if (c && Date.now() - c.checkedAtMs < Math.max(250, this.settings.tickMs * 2)) return c.ok ? c : undefined
    void this.store.getBatch(batchId).then((b) => {
      if (b)
        this.running.set(batchId, {
          keyId: b.keyId,
          orgId: b.orgId,
          checkedAtMs: Date.now(),
          ok: b.status === 'in_progress',
        })
    })
    return c?.ok ? c : undefined
  }

  /** Batches failing (money ran out, key revoked): their lines are refused at once. */
  private readonly failing = new Set<string>()

  /** Fails a running batch: lines in flight finish, the rest fail with `code`, then it is finalized. */
  private failBatchSoon(batchId: string, code: string, why: string): void {
    if (this.busy.has(batchId)) return
    this.busy.add(batchId)
    this.failBatch(batchId, code, why)
      .then((handedOff) => {
        // Once finalize() has it, the batch is busy until the worker says it is finalized.
        if (!handedOff) this.busy.delete(batchId)
      })
      .catch((err) => {
        this.busy.delete(batchId)
        this.log('error', 'failing a batch failed; the next tick tries again', {
          batch: batchId,
          error: String(err),
        })
      })
      .finally(() => this.failing.delete(batchId))
  }

  /** True once the batch went on to finalize(). */
  private async failBatch(batchId: string, code: string, why: string): Promise<boolean> {
    const b = await this.store.getBatch(batchId)
    if (b?.status !== 'in_progress') return false
    this.failing.add(batchId)
    // Only over a running batch: another node may have finished or cancelled it meanwhile.
    const marked = await this.store.updateBatch(
      batchId,
      {
        errors: JSON.stringify({
          object: 'list',
          data: [{ code, line: null, param: null, message: `${why} during the batch` }],
        }),
      },
      ['in_progress'],
    )
    if (!marked) return false
    // Lines in flight finish first; lines handed back meanwhile (refused for money) are failed
    // too, until none is open; then the batch is finalized as failed.
    for (;;) {
      await this.store.failOpenLines(
        batchId,
        (l) => errorLine(l.customId, code, `${why} before this line ran`),
        true,
      )
      if ((await this.store.openLineCount(batchId)) === 0) break
      await Bun.sleep(50)
    }
    this.failing.delete(batchId)
    await this.finalize(b, 'failed')
    return true
  }
}

function errorLine(customId: string, code: string, message: string): string {
  return JSON.stringify({
    id: `batch_req_${requestId()}`,
    custom_id: customId,
    response: null,
    error: { code, message },
  })
}
