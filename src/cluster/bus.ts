import { RedisClient } from 'bun'
import type { PeerChannel } from './peer-nodes.ts'

/**
 * What one router node tells the others: a key changed (with its new status when that is the
 * change), an organization changed, or the receipt keys did (`id` is then the new signing kid).
 */
export type ClusterEvent = {
  readonly t: 'key' | 'org' | 'receipt-keys'
  readonly id: string
  readonly from: string
  readonly status?: 'active' | 'disabled' | 'revoked'
  /** An organization's rate limits changed (only they are read again, not its balance). */
  readonly limits?: true
}

type Wire =
  | (ClusterEvent & { readonly msg: string })
  | { readonly t: 'ack'; readonly msg: string; readonly to: string }
  | { readonly t: 'ping'; readonly from: string }

/**
 * Broadcast between router nodes sharing PostgreSQL. `healthy()` says whether this node can
 * trust that it hears every event right now; when it cannot, identity checks keys against the
 * store instead of its cache, so a revoked key is never served past the configured bound.
 */
export interface ClusterBus {
  readonly nodeId: string
  publish(e: ClusterEvent): Promise<void>
  /**
   * Publishes and waits until every other subscribed node has applied the event (or `timeoutMs`
   * passed): a revocation answered after this is in force on every node that heard it.
   */
  publishAndConfirm(e: ClusterEvent, timeoutMs: number): Promise<boolean>
  /**
   * The handler runs synchronously on arrival; the node acknowledges once it returns, or once the
   * promise it returns settles.
   */
  subscribe(handler: (e: ClusterEvent) => unknown): Promise<void>
  /**
   * Another handler, of the events of one kind; the node acknowledges once it returns, or once
   * the promise it returns settles (so publishAndConfirm waits for what it does).
   */
  on(t: ClusterEvent['t'], handler: (e: ClusterEvent) => unknown): void
  healthy(): boolean
  /**
   * When this node last (re)subscribed: events published before it may never have arrived, so a
   * key not confirmed against the store since then is confirmed once before it is served.
   */
  listeningSinceMs(): number
  close(): Promise<void>
}

/**
 * Redis pub/sub; a subscribed connection takes no other commands, so it has its own.
 *
 * Health is proven end to end: every quarter bound the node publishes a ping to itself on the
 * channel, and it is healthy only while it has heard its own ping within the bound. (A client
 * that reconnects after Redis restarted does not subscribe again by itself and reports no close,
 * so "connected" alone would leave a node deaf while it believed itself healthy.) When the ping
 * has not come back within the bound, the node subscribes again.
 */
export class RedisBus implements ClusterBus {
  private readonly pub: RedisClient
  private readonly sub: RedisClient
  private listeningSince = Number.POSITIVE_INFINITY
  private lastHeardMs = 0
  private timer: ReturnType<typeof setInterval> | undefined
  private readonly channel: string
  private seq = 0
  private readonly waiting = new Map<string, () => void>()
  private handler: ((e: ClusterEvent) => unknown) | undefined
  private readonly handlers = new Map<ClusterEvent['t'], (e: ClusterEvent) => unknown>()
  private resubscribing = false
  private resubscribedAtMs = 0
  private subscribed = false
  /** Channels beside the events' (`channelOf`), by their Redis name. */
  private readonly extra = new Map<string, (text: string) => void>()

  constructor(
    url: string,
    private readonly prefix: string,
    readonly nodeId: string,
    private readonly boundMs: number,
  ) {
    const opts = {
      connectionTimeout: Math.max(200, boundMs),
      autoReconnect: true,
      maxRetries: 1_000_000,
      enableOfflineQueue: false,
    }
    this.pub = new RedisClient(url, opts)
    this.sub = new RedisClient(url, opts)
    this.channel = `${prefix}events`
  }

  private onMessage = (message: string) => {
    let w: Wire
    try {
      w = JSON.parse(message) as Wire
    } catch {
      return // a malformed message is not ours to act on
    }
    if (w.t === 'ping') {
      if (w.from !== this.nodeId) return
      const now = Date.now()
      // Heard again after a gap: events sent meanwhile may be lost (see listeningSinceMs).
      if (now - this.lastHeardMs >= this.boundMs) this.listeningSince = now
      this.lastHeardMs = now
      return
    }
    if (w.t === 'ack') {
      if (w.to === this.nodeId) this.waiting.get(w.msg)?.()
      return
    }
    if (w.from === this.nodeId) return
    const ack = () =>
      void this.pub
        .publish(this.channel, JSON.stringify({ t: 'ack', msg: w.msg, to: w.from }))
        .catch(() => {})
    const own = this.handlers.get(w.t)
    const done = own ? own(w) : this.handler?.(w)
    if (done instanceof Promise) done.then(ack, ack)
    else ack()
  }

  private async listen(): Promise<void> {
    // The client may still believe it is subscribed from before a reconnect: start over.
    await this.sub.unsubscribe(this.channel).catch(() => {})
    await this.sub.subscribe(this.channel, this.onMessage)
    for (const [ch, h] of this.extra) {
      await this.sub.unsubscribe(ch).catch(() => {})
      await this.sub.subscribe(ch, h)
    }
  }

  /**
   * A channel beside the events' (`<prefix><name>`) on the same connections: what is published
   * there is heard by every node, this one included, with no acknowledgement and no delivery
   * guarantee (cluster/peer-nodes.ts repeats itself every second).
   */
  channelOf(name: string): PeerChannel {
    const ch = `${this.prefix}${name}`
    return {
      publish: (text) => void this.pub.publish(ch, text).catch(() => {}),
      listen: (handler) => {
        this.extra.set(ch, handler)
        if (this.subscribed) void this.sub.subscribe(ch, handler).catch(() => {})
      },
    }
  }

  private resubscribe(): void {
    if (this.resubscribing || !this.sub.connected) return
    this.resubscribing = true
    this.resubscribedAtMs = Date.now()
    void this.listen()
      .catch(() => {})
      .finally(() => {
        this.resubscribing = false
      })
  }

  async subscribe(handler: (e: ClusterEvent) => unknown): Promise<void> {
    this.handler = handler
    try {
      await Promise.all([this.pub.connect(), this.sub.connect()])
    } catch (err) {
      throw new Error(`cannot reach Redis for the cluster bus: ${(err as Error).message}`)
    }
    await this.sub.subscribe(this.channel, this.onMessage)
    for (const [ch, h] of this.extra) await this.sub.subscribe(ch, h)
    this.subscribed = true
    // After a reconnect the subscription must be made again; until then events may be missed.
    this.sub.onconnect = () => this.resubscribe()
    const now = Date.now()
    this.listeningSince = now
    this.lastHeardMs = now
    this.timer = setInterval(
      () => {
        // Not heard for the bound, and a bound since the last attempt (its own ping needs time to come back).
        const now = Date.now()
        if (now - this.lastHeardMs >= this.boundMs && now - this.resubscribedAtMs >= this.boundMs)
          this.resubscribe()
        void this.pub.publish(this.channel, JSON.stringify({ t: 'ping', from: this.nodeId })).catch(() => {})
      },
      Math.max(50, Math.floor(this.boundMs / 4)),
    )
    this.timer.unref?.()
  }

  on(t: ClusterEvent['t'], handler: (e: ClusterEvent) => unknown): void {
    this.handlers.set(t, handler)
  }

  healthy(): boolean {
    return this.sub.connected && Date.now() - this.lastHeardMs < this.boundMs
  }

  listeningSinceMs(): number {
    return this.listeningSince
  }

  async publish(e: ClusterEvent): Promise<void> {
    await this.pub.publish(this.channel, JSON.stringify({ ...e, msg: `${this.nodeId}:${++this.seq}` }))
  }

  async publishAndConfirm(e: ClusterEvent, timeoutMs: number): Promise<boolean> {
    const msg = `${this.nodeId}:${++this.seq}`
    let acks = 0
    let expected = Number.POSITIVE_INFINITY
    let finish!: (ok: boolean) => void
    const done = new Promise<boolean>((resolve) => {
      finish = resolve
    })
    const timer = setTimeout(() => finish(false), timeoutMs)
    this.waiting.set(msg, () => {
      if (++acks >= expected) finish(true)
    })
    try {
      // PUBLISH answers how many subscribers got it, this node's own subscription included.
      expected = (await this.pub.publish(this.channel, JSON.stringify({ ...e, msg }))) - 1
      if (acks >= expected) finish(true)
      return await done
    } catch {
      // Redis is away: answer once the bound has passed, when every node that cannot hear it
      // has noticed and confirms keys against the store.
      return await done
    } finally {
      clearTimeout(timer)
      this.waiting.delete(msg)
    }
  }

  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer)
    this.sub.close()
    this.pub.close()
  }
}
