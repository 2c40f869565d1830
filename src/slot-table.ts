/**
 * The short-lived members of a long-lived owner (attempts in flight on a node, upstream
 * deadlines, open request records, open streams): an array of slots, freed ones reused.
 * `add` gives the member's slot; the member (or its owner) keeps it for `delete`.
 *
 * Why not a `Map` or a `Set`: in Bun 1.4.5's JavaScriptCore, an old `Map` or `Set` whose members
 * come and go keeps the members it dropped reachable until its next young-generation
 * collection, which marks each of them, and everything it holds, again. A request's attempt or
 * record holds its controllers, readers and closures: 2-3 µs of a stopped event loop per request
 * (a `Set` of 32 objects turned over 3,000 times: 8.8 ms of collection against 0.2 ms for these
 * slots; bench/results/2026-11-27-eden-rolling-maps.md). A slot overwritten holds only its new
 * member. A `Map` from a short string to a number (a slot) costs little the same way: what it
 * keeps of a dropped entry is the string alone (0.28 ms in that benchmark).
 *
 * Unlike a `Set`, adding a member twice takes two slots: callers add fresh objects. The array
 * keeps the length of its busiest moment (8 bytes a slot; scans skip the empty ones).
 */
export class SlotTable<T> {
  private readonly items: (T | undefined)[] = []
  /** Free slots, reused last-freed first. */
  private readonly free: number[] = []
  private count = 0

  get size(): number {
    return this.count
  }

  /** Adds a member (not checked for being in already); returns its slot. */
  add(member: T): number {
    const slot = this.free.pop()
    this.count++
    if (slot === undefined) return this.items.push(member) - 1
    this.items[slot] = member
    return slot
  }

  /** The member in `slot`, if any. */
  get(slot: number): T | undefined {
    return this.items[slot]
  }

  /**
   * Frees `slot` if `member` is still the one in it (a second delete of the same member, after
   * its slot went to another, changes nothing). Returns whether it did.
   */
  delete(slot: number, member: T): boolean {
    if (slot < 0 || this.items[slot] !== member || member === undefined) return false
    this.items[slot] = undefined
    this.free.push(slot)
    this.count--
    return true
  }

  /** Calls `fn` on every member; members deleted or added meanwhile may or may not be visited. */
  forEach(fn: (member: T, slot: number) => void): void {
    const items = this.items
    for (let i = 0; i < items.length; i++) {
      const m = items[i]
      if (m !== undefined) fn(m, i)
    }
  }

  /** Whether `fn` holds for some member. */
  some(fn: (member: T) => boolean): boolean {
    const items = this.items
    for (let i = 0; i < items.length; i++) {
      const m = items[i]
      if (m !== undefined && fn(m)) return true
    }
    return false
  }

  /** Every member, in slot order. */
  toArray(): T[] {
    const out: T[] = []
    this.forEach((m) => {
      out.push(m)
    })
    return out
  }

  clear(): void {
    this.items.length = 0
    this.free.length = 0
    this.count = 0
  }
}
