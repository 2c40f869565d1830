import { SlotTable } from '../slot-table.ts'

/** A deadline on one upstream exchange; the pipeline moves it as bytes arrive. */
export interface Deadline {
  atMs: number
  readonly onExpire: () => void
  /** Its slot in the watchdog (a SlotTable: no Map or Set of per-request members on the hot path). */
  readonly slot: number
}

/**
 * One sweeping timer for every upstream deadline (first byte, idle gap) instead of a timer per
 * chunk per stream: moving a deadline is a field write on the hot path.
 */
export class Watchdog {
  private readonly live = new SlotTable<Deadline>()
  private timer: ReturnType<typeof setInterval> | undefined

  constructor(private readonly tickMs = 100) {}

  watch(atMs: number, onExpire: () => void): Deadline {
    const d = { atMs, onExpire, slot: -1 }
    d.slot = this.live.add(d)
    if (!this.timer) {
      this.timer = setInterval(() => this.sweep(), this.tickMs)
      this.timer.unref?.()
    }
    return d
  }

  clear(d: Deadline): void {
    this.live.delete(d.slot, d)
    if (this.live.size === 0 && this.timer) {
      clearInterval(this.timer)
      this.timer = undefined
    }
  }

  private sweep() {
    const now = Date.now()
    const expired: Deadline[] = []
    this.live.forEach((d) => {
      if (d.atMs <= now) expired.push(d)
    })
    for (const d of expired) {
      // An earlier callback may have cleared this one, or moved it on.
      if (this.live.get(d.slot) !== d || d.atMs > now) continue
      this.clear(d)
      d.onExpire()
    }
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
    this.live.clear()
  }
}
