/**
 * The router's own event loop, watched. While it stands still (the tokenizer's tables loading
 * at the first request that counts tokens, a long garbage collection, a burst of work), every
 * chunk that arrives waits for it, so a first token's time measured across the stall is the
 * router's, not the node's. The routing policy learns nothing from such an attempt
 * (`Attempt.routerStalled`). A timer ticks every 50 ms (unref'd: it keeps no process alive);
 * a tick over 50 ms late is a stall.
 */
const TICK_MS = 50
const LATE_MS = 50

let timer: ReturnType<typeof setInterval> | undefined
let lastTickMs = 0
let lastStallEndMs = Number.NEGATIVE_INFINITY

function tick(): void {
  const now = Date.now()
  if (now - lastTickMs > TICK_MS + LATE_MS) lastStallEndMs = now
  lastTickMs = now
}

/** Starts the watch (once per process; later calls do nothing). */
export function watchLoop(): void {
  if (timer !== undefined) return
  lastTickMs = Date.now()
  timer = setInterval(tick, TICK_MS)
  timer.unref?.()
}

/**
 * Whether the loop stood still at some moment from `sinceMs` to `nowMs` (Date.now clock): a
 * stall seen to end since then, or one the loop is only now coming out of (the chunk being
 * handled ran before the late tick). False while the watch is not started.
 */
export function loopStalledSince(sinceMs: number, nowMs: number): boolean {
  if (timer === undefined) return false
  return lastStallEndMs >= sinceMs || nowMs - lastTickMs > TICK_MS + LATE_MS
}
