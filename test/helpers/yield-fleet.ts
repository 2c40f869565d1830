import { startSimFleet } from '../../src/simulator/index.ts'

/** Sequences of each node of `startYieldFleet`. */
export const YIELD_SEQS = 4

/**
 * Two simulated nodes of YIELD_SEQS sequences at 20 ms a token, for the tests of batches yielding
 * to interactive traffic: a line of 40 tokens holds its slot for about a second.
 */
export async function startYieldFleet() {
  const fleet = await startSimFleet(
    [1, 2].map((i) => ({
      name: `sim-${i}`,
      maxSeqs: YIELD_SEQS,
      prefillTokensPerSec: 50_000,
      itlMs: 20,
      iterationOverheadMs: 1,
      ignoreEos: true,
      seed: i,
    })),
  )
  return {
    ...fleet,
    /** Sequences running on the nodes now. */
    running: () => fleet.nodes.reduce((s, n) => s + n.stats().running, 0),
    /** Requests each node saw cancelled by the client, in node order. */
    aborted: () => fleet.nodes.map((n) => n.stats().aborted),
  }
}

/**
 * Batch settings of the yield tests: a quick tick, one worker thread, every slot for lines, and a
 * quiet_load one interactive stream exceeds (1/8 of two nodes' 8 slots is over 0.1).
 */
export const YIELD_BATCHES = {
  tick_ms: 20,
  workers: 1,
  concurrency: 32,
  quiet_ms: 300,
  reserve_slots: 0,
  quiet_load: 0.1,
}

/** Polls `what` every 20 ms until it holds; throws after `tries`. */
export async function until(what: () => boolean, tries = 500): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (what()) return
    await Bun.sleep(20)
  }
  throw new Error('condition not reached')
}

/** A streamed chat request of `maxTokens` to `url`, on a connection of its own: its status and text. */
export const streamOnce = (url: string, key: string, maxTokens: number, content: string) =>
  fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    keepalive: false,
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'test/chat',
      messages: [{ role: 'user', content }],
      max_tokens: maxTokens,
      stream: true,
    }),
  }).then(async (res) => ({
    status: res.status,
    node: res.headers.get('x-tropa-node'),
    text: await res.text(),
  }))
