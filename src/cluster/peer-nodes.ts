import {
  ChangedNodes,
  type InteractiveReport,
  interactiveReport,
  type NodePool,
  type NodeState,
} from '../routing/nodes.ts'

/** A channel every router node of the cluster publishes on and hears (Redis pub/sub: cluster/bus.ts). */
export interface PeerChannel {
  publish(text: string): void
  listen(handler: (text: string) => void): void
}

/** One node's report: its id, whether it is every upstream it runs requests on, and those upstreams. */
interface PeerReport {
  readonly from: string
  /** Every upstream node of this router's pool (absent ones have none): a sync, not a change. */
  readonly all?: true
  readonly n: readonly Readonly<InteractiveReport>[]
}

/** A node that has reported nothing for this long has its requests forgotten (it died, or its batch ended). */
const EXPIRE_MS = 3_000
/** While reporting, every node is reported this often (so a node that starts late, or missed one, catches up). */
const SYNC_MS = 1_000

/**
 * The cluster's router nodes each run a batch scheduler over the same queue, and each sees only
 * the interactive requests it serves. While a batch wants nodes, each node publishes, once per
 * event-loop turn, how many interactive requests it runs on each upstream node that changed (all
 * of them every second), and mirrors the others' into its pool (`NodeState.remoteInteractive`):
 * its lines yield to another router's request on their upstream as to one of its own (pre-empted
 * as it arrives), and its plan sees the fleet's whole interactive load. A node not heard from for
 * 3 s has its requests forgotten. Without a batch nothing is sent.
 */
export class PeerNodes {
  /** By peer: interactive requests it reported, by base URL, and when it was last heard. */
  private readonly peers = new Map<string, { counts: Map<string, number>; heardAtMs: number }>()
  private readonly changed: ChangedNodes
  private reporting = false
  /** Set while others' requests are written into the pool: they are not this node's to report. */
  private mirroring = false
  private timer: ReturnType<typeof setInterval> | undefined

  constructor(
    private readonly pool: NodePool,
    private readonly nodeId: string,
    /** Whether this node's scheduler wants nodes for a batch (then it reports, and listens). */
    private readonly wanting: () => boolean,
    private readonly channel: PeerChannel,
  ) {
    const before = pool.onInteractiveChange
    pool.onInteractiveChange = (nowMs, node) => {
      before?.(nowMs, node)
      this.local(node)
    }
    this.changed = new ChangedNodes((n) =>
      this.channel.publish(JSON.stringify({ from: this.nodeId, n } satisfies PeerReport)),
    )
    channel.listen((text) => this.receive(text))
    this.timer = setInterval(() => this.sync(), SYNC_MS)
    this.timer.unref?.()
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
  }

  /** One of this node's own interactive requests started or ended on `node`. */
  private local(node: NodeState): void {
    if (this.mirroring) return
    if (!this.wanting()) {
      this.reporting = false
      return
    }
    if (!this.reporting) {
      // Reporting starts: every node, so the others' counts of ours start right.
      this.reporting = true
      for (const n of this.pool.nodes.values()) this.changed.add(n)
    }
    this.changed.add(node)
  }

  /** Every second while a batch wants nodes: all of ours (a sync), and the silent peers forgotten. */
  private sync(): void {
    const now = Date.now()
    for (const [id, p] of this.peers) if (now - p.heardAtMs >= EXPIRE_MS) this.forget(id)
    this.reporting = this.wanting()
    if (!this.reporting) return
    const n = [...this.pool.nodes.values()].map(interactiveReport)
    this.channel.publish(JSON.stringify({ from: this.nodeId, all: true, n } satisfies PeerReport))
  }

  private receive(text: string): void {
    let r: PeerReport
    try {
      r = JSON.parse(text) as PeerReport
    } catch {
      return
    }
    if (!r || typeof r.from !== 'string' || r.from === this.nodeId || !Array.isArray(r.n)) return
    const now = Date.now()
    let p = this.peers.get(r.from)
    if (!p) {
      p = { counts: new Map(), heardAtMs: now }
      this.peers.set(r.from, p)
    }
    p.heardAtMs = now
    const named = r.all ? new Set<string>() : undefined
    for (const e of r.n) {
      if (!Array.isArray(e)) continue
      const [baseUrl, count, atMs] = e
      if (typeof baseUrl !== 'string' || typeof count !== 'number' || typeof atMs !== 'number') continue
      named?.add(baseUrl)
      this.set(p.counts, baseUrl, Math.max(0, count), Math.min(atMs, now), now)
    }
    // A sync names every node the peer routes to: one it does not name has none of its requests.
    if (named)
      for (const baseUrl of p.counts.keys()) if (!named.has(baseUrl)) this.set(p.counts, baseUrl, 0, now, now)
  }

  private set(
    counts: Map<string, number>,
    baseUrl: string,
    count: number,
    atMs: number,
    nowMs: number,
  ): void {
    const before = counts.get(baseUrl) ?? 0
    if (count === 0) counts.delete(baseUrl)
    else counts.set(baseUrl, count)
    const node = this.pool.nodes.get(baseUrl)
    if (node && (count !== before || atMs > node.lastInteractiveAtMs))
      this.mirror(node, count - before, atMs, nowMs)
  }

  private mirror(node: NodeState, delta: number, atMs: number, nowMs: number): void {
    this.mirroring = true
    try {
      this.pool.mirrorInteractive(node, delta, atMs, nowMs)
    } finally {
      this.mirroring = false
    }
  }

  private forget(id: string): void {
    const p = this.peers.get(id)
    this.peers.delete(id)
    if (!p) return
    const now = Date.now()
    for (const [baseUrl, n] of p.counts) {
      const node = this.pool.nodes.get(baseUrl)
      if (node) this.mirror(node, -n, now, now)
    }
  }
}
