import { RedisClient } from 'bun'

/** What one router node tells the others: a key changed (with its new status when that is the change). */
export type ClusterEvent = {
  readonly t: 'key' | 'org'
  readonly id: string
  readonly from: string
  readonly status?: 'active' | 'disabled' | 'revoked'
}

type Wire =
  | (ClusterEvent & { readonly msg: string })
  | { readonly t: 'ack'; readonly msg: string; readonly to: string }

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
  /** The handler runs synchronously on arrival; the node acknowledges once it returns. */
  subscribe(handler: (e: ClusterEvent) => void): Promise<void>
  healthy(): boolean
  close(): Promise<void>
}

/** Redis pub/sub; a subscribed connection takes no other commands, so it has its own. */
export class RedisBus implements ClusterBus {
  private readonly pub: RedisClient
  private readonly sub: RedisClient
  private subscribed = false
  private lastPongMs = 0
  private timer: ReturnType<typeof setInterval> | undefined
  private readonly channel: string
  private seq = 0
  private readonly waiting = new Map<string, () => void>()

  constructor(
    url: string,
    prefix: string,
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

  async subscribe(handler: (e: ClusterEvent) => void): Promise<void> {
    const listen = async () => {
      await this.sub.subscribe(this.channel, (message) => {
        let w: Wire
        try {
          w = JSON.parse(message) as Wire
        } catch {
          return // a malformed message is not ours to act on
        }
        if (w.t === 'ack') {
          if (w.to === this.nodeId) this.waiting.get(w.msg)?.()
          return
        }
        if (w.from === this.nodeId) return
        handler(w)
        void this.pub
          .publish(this.channel, JSON.stringify({ t: 'ack', msg: w.msg, to: w.from }))
          .catch(() => {})
      })
      this.subscribed = true
    }
    this.sub.onclose = () => {
      this.subscribed = false
    }
    this.sub.onconnect = () => {
      // After a reconnect the subscription must be made again; until then events may be missed.
      if (!this.subscribed) void listen().catch(() => {})
    }
    try {
      await Promise.all([this.pub.connect(), this.sub.connect()])
    } catch (err) {
      throw new Error(`cannot reach Redis for the cluster bus: ${(err as Error).message}`)
    }
    await listen()
    this.lastPongMs = Date.now()
    // A heartbeat on the command connection: a silent Redis is noticed within the bound.
    this.timer = setInterval(
      () => {
        void this.pub
          .send('PING', [])
          .then(() => {
            this.lastPongMs = Date.now()
          })
          .catch(() => {})
      },
      Math.max(50, Math.floor(this.boundMs / 4)),
    )
    this.timer.unref?.()
  }

  healthy(): boolean {
    return this.subscribed && this.sub.connected && Date.now() - this.lastPongMs < this.boundMs
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
      finish(false)
      return false
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
