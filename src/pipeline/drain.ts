import { SlotTable } from '../slot-table.ts'

/**
 * The streams being relayed, so that a graceful stop can end the ones still open at its deadline
 * (each with one error event, billed for what it was sent) instead of cutting their sockets.
 * A stream's `end` takes a slot (SlotTable: no Set of per-request closures on the hot path).
 */
export class OpenStreams {
  private readonly ends = new SlotTable<() => void>()

  /** Registers a stream still open; `end` finishes it cleanly. Returns its slot, for `delete`. */
  add(end: () => void): number {
    return this.ends.add(end)
  }

  delete(slot: number, end: () => void): void {
    this.ends.delete(slot, end)
  }

  get size(): number {
    return this.ends.size
  }

  /** Ends every stream still open; returns how many there were. */
  endAll(): number {
    const ends = this.ends.toArray()
    this.ends.clear()
    for (const end of ends) end()
    return ends.length
  }
}
