import { RateLimited } from '../errors.ts'
import type { LiveKey } from '../identity/live.ts'

/** One request in flight under its key's `max_concurrency`. */
export interface Slot {
  /** Frees the slot; only the first call counts, so every path of a request may call it. */
  release(): void
}

/**
 * A key's `max_concurrency`: requests in flight at once, from admission until the answer (the
 * whole stream) ended or the client left. `acquire` takes a slot or throws 429
 * `key_concurrency_exceeded`; it returns a promise only when it has to ask another process, and
 * must be called only for a key with a bound (`key.maxConcurrency !== null`: the caller's field
 * check is all a key without one costs). `inFlight` counts the key's requests now (quotes).
 */
export interface ConcurrencyLimiter {
  acquire(key: LiveKey): Slot | Promise<Slot>
  inFlight(key: LiveKey): Promise<number>
}

/** The 429 of a key whose slots are all taken; a slot frees when a request ends, so retry soon. */
export const concurrencyReached = (key: LiveKey) =>
  new RateLimited(
    `this key already has ${key.maxConcurrency} requests in flight (its max_concurrency); retry when one ends`,
    1,
    'key_concurrency_exceeded',
  )

/** On one node: a count per key in memory. */
export class LocalConcurrency implements ConcurrencyLimiter {
  private readonly counts = new Map<string, number>()

  acquire(key: LiveKey): Slot {
    const n = this.counts.get(key.id) ?? 0
    if (key.maxConcurrency !== null && n >= key.maxConcurrency) throw concurrencyReached(key)
    this.counts.set(key.id, n + 1)
    let held = true
    return {
      release: () => {
        if (!held) return
        held = false
        const left = (this.counts.get(key.id) ?? 1) - 1
        if (left <= 0) this.counts.delete(key.id)
        else this.counts.set(key.id, left)
      },
    }
  }

  async inFlight(key: LiveKey): Promise<number> {
    return this.counts.get(key.id) ?? 0
  }
}
