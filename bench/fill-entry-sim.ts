// How often a rule for starting batch lines beside interactive traffic reads a steady 50% (or 80%)
// load as a valley, and how long after a peak it finds a real one: Poisson arrivals only, no router
// (batches/scheduler.ts `inValley`; docs/batches.md, "Filling").
//
//   bun bench/fill-entry-sim.ts [--runs 200]
//
// The fleet has 64 slots and fill_load is 0.1, as in bench/batch-yield.ts. A 50% load there is
// about 17 arrivals a second of ~0.7 s each (12 in flight, 0.19 of the slots); a valley 3.3 a
// second after a peak of 30 a second of ~1 s. The demand is the arrivals over a window times a
// mean time in flight: 0.7 s at 50%, and 1.3 s after a peak (Demand's 10 s average still holds
// the peak's slower requests); 1 s at 80% (27 a second). Each rule is checked every 5 ms and, once it holds, again 0.5 s
// later; a run of 20 s at 50% counts as read as a valley when the rule holds between its 1.5th
// and 19.5th second (its first and last moments have no whole window behind or ahead). Only
// the entry is modelled: not how long a valley lasts (the scheduler keeps it until lines would
// be pre-empted), not the start condition within it, nor the lines slowing the requests.
import { parseArgs } from 'node:util'
import { ValleyEntry } from '../src/batches/demand.ts'
import { prng } from '../src/simulator/text.ts'

const { values } = parseArgs({ options: { runs: { type: 'string' } } })
const RUNS = Number(values.runs ?? 200)
const SLOTS = 64
const FILL = 0.1

type Phase = { perSec: number; seconds: number; meanSec: number }
/** `entry`: what the shipped rule (`ValleyEntry`, fed every reading of the run) says now. */
type Reading = { inFlight: number; half: number; second: number; entry: boolean }
type Rule = { name: string; holds: (r: Reading) => boolean }

const RULES: Rule[] = [
  {
    name: 'second demand <= fill/2 for 0.5 s, or within 2 s of a peak, half-second demand <= fill (now, ValleyEntry)',
    holds: (r) => r.entry,
  },
  {
    name: 'in flight <= fill, or half-second demand <= fill/2 (before)',
    holds: (r) => r.inFlight <= FILL || r.half <= FILL / 2,
  },
  { name: 'second demand <= fill/2', holds: (r) => r.second <= FILL / 2 },
  { name: 'second demand <= 3/4 fill', holds: (r) => r.second <= 0.75 * FILL },
  { name: 'second demand <= fill', holds: (r) => r.second <= FILL },
  {
    name: 'second demand <= 3/4 fill, or half-second demand <= fill/4',
    holds: (r) => r.second <= 0.75 * FILL || r.half <= FILL / 4,
  },
  {
    name: 'second demand <= 3/4 fill, or half-second demand <= fill/2',
    holds: (r) => r.second <= 0.75 * FILL || r.half <= FILL / 2,
  },
]

/** The times (s) at which the rule first holds, then again 0.5 s after each. */
function entries(seed: number, phases: Phase[], demandMeanSec: number, rule: Rule): number[] {
  const r = prng(seed)
  const starts: number[] = []
  const ends: number[] = []
  let t = 0
  for (const p of phases) {
    const end = t + p.seconds
    for (;;) {
      t += -Math.log(1 - r()) / p.perSec
      if (t >= end) break
      starts.push(t)
      ends.push(t + p.meanSec * (0.6 + 0.8 * r()))
    }
    t = end
  }
  const out: number[] = []
  let first = 0
  const entry = new ValleyEntry()
  for (let x = 0; x < t; x += 0.005) {
    while (first < starts.length && starts[first]! <= x - 1) first++
    let inFlight = 0
    let second = 0
    let half = 0
    for (let i = first; i < starts.length && starts[i]! <= x; i++) {
      second++
      if (starts[i]! > x - 0.5) half++
    }
    for (let i = 0; i < starts.length && starts[i]! <= x; i++) if (ends[i]! > x) inFlight++
    const reading = {
      inFlight: inFlight / SLOTS,
      half: (half / 0.5) * (demandMeanSec / SLOTS),
      second: second * (demandMeanSec / SLOTS),
      entry: false,
    }
    reading.entry = entry.enters(x * 1000, reading.second, reading.half, FILL)
    if (rule.holds(reading)) {
      out.push(x)
      x += 0.5
    }
  }
  return out
}

const pct = (xs: number[], q: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * q))]!
console.log(
  `| rule | 50% runs of 20 s read as a valley | readings per run | 80% runs read as a valley | after a peak, a valley found in (p50, p90 s) |`,
)
console.log('|---|---|---|---|---|')
for (const rule of RULES) {
  let falseRuns = 0
  let falseEighty = 0
  let falseCount = 0
  const delays: number[] = []
  for (let s = 1; s <= RUNS; s++) {
    const steady = entries(s, [{ perSec: 17, seconds: 20, meanSec: 0.7 }], 0.7, rule).filter(
      (x) => x > 1.5 && x < 19.5,
    )
    const eighty = entries(20_000 + s, [{ perSec: 27, seconds: 20, meanSec: 1 }], 1, rule).filter(
      (x) => x > 1.5 && x < 19.5,
    )
    if (eighty.length > 0) falseEighty++
    if (steady.length > 0) falseRuns++
    falseCount += steady.length
    const after = entries(
      10_000 + s,
      [
        { perSec: 30, seconds: 10, meanSec: 1 },
        { perSec: 3.3, seconds: 10, meanSec: 0.7 },
      ],
      1.3,
      rule,
    ).filter((x) => x >= 10)
    delays.push(after.length > 0 ? after[0]! - 10 : 10)
  }
  console.log(
    `| ${rule.name} | ${(falseRuns / RUNS).toFixed(3)} | ${(falseCount / RUNS).toFixed(2)} | ${(falseEighty / RUNS).toFixed(3)} | ${pct(delays, 0.5).toFixed(2)}, ${pct(delays, 0.9).toFixed(2)} |`,
  )
}
