import { writeFileSync } from 'node:fs'
import { type SimNodeOptions, startSimFleet } from '../src/simulator/index.ts'

/**
 * The simulated upstream fleet, in a process of its own so that its CPU is not the load
 * generator's. Three fleets of three nodes each, all Tropa's own simulator:
 * - fast:   timeScale 0, answers at once (non-streaming latency and throughput);
 * - stream: a fixed 5 ms inter-token latency (streaming overhead), each chunk stamped with the
 *           time it was sent (`x_sent_ms`);
 * - hold:   one token every `holdItlMs`, to keep thousands of streams open for the memory test.
 *
 * Usage: bun bench/fleet.ts <json FleetSpec> <out file>; writes FleetUrls as JSON to the out
 * file once every node listens, then runs until SIGTERM.
 */

export type FleetName = 'fast' | 'stream' | 'hold'
export const FLEETS: readonly FleetName[] = ['fast', 'stream', 'hold']

export interface FleetSpec {
  nodesPerFleet: number
  streamItlMs: number
  holdItlMs: number
}

export type FleetUrls = Record<FleetName, string[]>

/** Node options per fleet: nothing but the deliberate delay should shape the timings. */
export function fleetOptions(spec: FleetSpec): Record<FleetName, SimNodeOptions[]> {
  const nodes = (fleet: FleetName, extra: Partial<SimNodeOptions>) =>
    Array.from({ length: spec.nodesPerFleet }, (_, i) => ({
      name: `${fleet}-${i + 1}`,
      seed: i + 1,
      // No queueing in the engine: a proxy's overhead, not the simulated GPU, is under test.
      maxSeqs: 1_000_000,
      prefillTokensPerSec: 1e9,
      prefillBudgetTokens: 1e9,
      iterationOverheadMs: 0,
      // A fixed step whatever the batch: thousands of held streams must not slow every token.
      decodeMsPerSeq: 0,
      ...extra,
    }))
  return {
    fast: nodes('fast', { timeScale: 0 }),
    // Each chunk stamped when sent: what a proxy adds to every token, free of the node's own jitter.
    stream: nodes('stream', { timeScale: 1, itlMs: spec.streamItlMs, stampChunks: true }),
    hold: nodes('hold', { timeScale: 1, itlMs: spec.holdItlMs }),
  }
}

async function main(): Promise<void> {
  const [specText, out] = process.argv.slice(2)
  if (!specText || !out) throw new Error('usage: bun bench/fleet.ts <json spec> <out file>')
  const opts = fleetOptions(JSON.parse(specText) as FleetSpec)
  const fleets = await Promise.all(FLEETS.map((f) => startSimFleet(opts[f])))
  const urls = Object.fromEntries(FLEETS.map((f, i) => [f, fleets[i]!.nodes.map((n) => n.url)])) as FleetUrls
  writeFileSync(out, JSON.stringify(urls))
  const stop = async () => {
    await Promise.all(fleets.map((f) => f.stop()))
    process.exit(0)
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

if (import.meta.main) await main()
