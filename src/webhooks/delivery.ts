import { lookup } from 'node:dns/promises'
import { isIP } from 'node:net'
import type { Config } from '../config/load.ts'
import type { Log } from '../log.ts'
import type { Store, WebhookAttempt, WebhookDeliveryJob } from '../storage/store.ts'
import { signatureHeader } from './events.ts'
import { privateAddress } from './urls.ts'

type WebhookConfig = Config['webhooks']

/** The config's `webhooks` section, and what the node adds. */
export interface DeliverySettings extends WebhookConfig {
  /** One node owns the store (SQLite): leases left by a killed process are dropped at start. */
  readonly soleOwner: boolean
  /** Called every poll before claiming (with several nodes: read the webhooks again). */
  readonly beforePoll?: () => Promise<void>
  readonly userAgent: string
}

/** Bytes of a receiver's answer read (for last_error); the rest is not read. */
const MAX_ANSWER_BYTES = 1024
/** Delivered and given-up rows are kept this long for GET /v1/webhooks/{id}/events. */
const KEEP_FINISHED_MS = 30 * 86_400_000

/**
 * Delivers the outbox: every `pollMs` a node claims due rows (a lease in the store, so with
 * several nodes each row is posted by one of them at a time), posts each signed, and records the
 * outcome. A 2xx answer is delivered; anything else (another status, a timeout, no connection) is
 * tried again after a delay doubling from `retryBaseMs` (with jitter, at most `retryMaxMs`), until
 * `giveUpAfterMs` after the event, when it is marked failed. Rows are never deleted before they are
 * delivered or given up, so a stop or a kill -9 loses none: an unfinished attempt's lease runs out
 * (at once, on the next start of a SQLite router) and the row is posted again with the same id.
 */
export class WebhookDelivery {
  private timer: ReturnType<typeof setInterval> | undefined
  private polling: Promise<void> | undefined
  private readonly inFlight = new Map<string, { abort: AbortController; done: Promise<void> }>()
  private stopped = false
  private lastPruneMs = 0
  private failing = false
  /** A row stays leased this long: an attempt's timeout with room to record its outcome. */
  private readonly leaseMs: number

  constructor(
    private readonly store: Store,
    private readonly s: DeliverySettings,
    private readonly log: Log,
    private readonly now: () => number = Date.now,
  ) {
    this.leaseMs = s.timeoutMs * 2 + 5000
  }

  start(): void {
    if (this.s.soleOwner)
      void this.store
        .releaseWebhookLeases()
        .then(
          (n) =>
            n > 0 &&
            this.log('info', 'webhook deliveries interrupted by a restart are due again', { events: n }),
        )
        .catch((err) => this.log('error', 'releasing webhook leases failed', { error: String(err) }))
    this.timer = setInterval(() => void this.poll(), this.s.pollMs)
    this.timer.unref?.()
  }

  /** One poll: claim what is due (up to the free delivery slots) and post it. */
  poll(): Promise<void> {
    if (this.stopped) return Promise.resolve()
    this.polling ??= this.pollOnce().finally(() => {
      this.polling = undefined
    })
    return this.polling
  }

  private async pollOnce(): Promise<void> {
    try {
      await this.s.beforePoll?.()
      const free = this.s.concurrency - this.inFlight.size
      if (free <= 0) return
      const now = this.now()
      const jobs = await this.store.claimWebhookEvents(now, this.leaseMs, free)
      for (const job of jobs) this.begin(job)
      if (now - this.lastPruneMs > 3_600_000) {
        this.lastPruneMs = now
        await this.store.pruneWebhookEvents(now - KEEP_FINISHED_MS, 1000)
      }
      if (this.failing) this.log('info', 'webhook delivery polls work again')
      this.failing = false
    } catch (err) {
      // Logged once per outage (the store away), not at every poll.
      if (!this.failing)
        this.log('error', 'webhook delivery poll failed; polling goes on', { error: String(err) })
      this.failing = true
    }
  }

  private begin(job: WebhookDeliveryJob) {
    const key = `${job.webhookId} ${job.eventId}`
    const abort = new AbortController()
    const done = this.attempt(job, abort.signal)
      .then((a) => this.store.finishWebhookEvent(job.webhookId, job.eventId, a))
      .catch((err) =>
        // The lease runs out and the row is posted again: at least once.
        this.log('error', 'recording a webhook delivery failed', { event: job.eventId, error: String(err) }),
      )
      .finally(() => this.inFlight.delete(key))
    this.inFlight.set(key, { abort, done })
  }

  /** One signed POST, and what it means for the row. */
  private async attempt(job: WebhookDeliveryJob, signal: AbortSignal): Promise<WebhookAttempt> {
    let httpStatus: number | null = null
    let error: string
    try {
      if (!this.s.allowPrivateUrls) await publicHost(job.url)
      const t = Math.floor(this.now() / 1000)
      const res = await fetch(job.url, {
        method: 'POST',
        body: job.payload,
        redirect: 'manual',
        signal: AbortSignal.any([signal, AbortSignal.timeout(this.s.timeoutMs)]),
        headers: {
          'content-type': 'application/json',
          'user-agent': this.s.userAgent,
          'tropa-event-id': job.eventId,
          'tropa-event-type': job.type,
          'tropa-delivery-attempt': String(job.attempts),
          'tropa-signature': signatureHeader(job.secret, t, job.payload),
        },
      })
      httpStatus = res.status
      const answer = await readSome(res, MAX_ANSWER_BYTES)
      if (res.status >= 200 && res.status < 300) return { status: 'delivered', atMs: this.now(), httpStatus }
      error = `HTTP ${res.status}${answer ? `: ${answer}` : ''}`
    } catch (err) {
      error = signal.aborted ? 'stopped before an answer' : errorText(err)
    }
    const now = this.now()
    const next = now + (signal.aborted ? 0 : this.backoff(job.attempts))
    const giveUp = !signal.aborted && next > job.createdAtMs + this.s.giveUpAfterMs
    if (giveUp)
      this.log('warn', 'a webhook event was given up', { webhook: job.webhookId, event: job.eventId, error })
    return { status: giveUp ? 'failed' : 'pending', nextAttemptAtMs: next, error, httpStatus }
  }

  /** The delay after the `attempts`-th failure: doubling, capped, between half and all of it. */
  private backoff(attempts: number): number {
    const full = Math.min(
      this.s.retryMaxMs,
      this.s.retryBaseMs * 2 ** Math.min(30, Math.max(0, attempts - 1)),
    )
    return Math.round(full / 2 + (Math.random() * full) / 2)
  }

  /**
   * Stops polling; attempts still in flight get until `graceMs` to finish, then are cut (their
   * rows stay pending, due at once: delivered again on the next start, with the same id).
   */
  async stop(graceMs = 2000): Promise<void> {
    this.stopped = true
    if (this.timer) clearInterval(this.timer)
    await this.polling
    const all = Promise.all([...this.inFlight.values()].map((f) => f.done))
    const timer = setTimeout(() => {
      for (const f of this.inFlight.values()) f.abort.abort()
    }, graceMs)
    await all
    clearTimeout(timer)
  }
}

/** Refuses a host that resolves to a loopback or private address (webhooks.allow_private_urls off). */
async function publicHost(url: string) {
  const host = new URL(url).hostname.replace(/^\[|\]$/g, '')
  const addresses = isIP(host) ? [host] : (await lookup(host, { all: true })).map((a) => a.address)
  if (addresses.some(privateAddress)) throw new Error(`${host} resolves to a loopback or private address`)
}

/** Up to `max` bytes of an answer as text (the rest is cancelled, never read). */
async function readSome(res: Response, max: number): Promise<string> {
  if (!res.body) return ''
  const reader = res.body.getReader()
  const parts: Uint8Array[] = []
  let n = 0
  try {
    while (n < max) {
      const { done, value } = await reader.read()
      if (done) break
      parts.push(value)
      n += value.byteLength
    }
  } finally {
    void reader.cancel().catch(() => {})
  }
  const bytes = Buffer.concat(parts).subarray(0, max)
  return new TextDecoder().decode(bytes).replace(/\s+/g, ' ').trim().slice(0, 300)
}

function errorText(err: unknown): string {
  const e = err as { name?: string; message?: string; code?: string }
  if (e?.name === 'TimeoutError') return 'timed out'
  return String(e?.message ?? e?.code ?? err).slice(0, 300)
}
