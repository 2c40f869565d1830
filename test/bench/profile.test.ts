import { expect, test } from 'bun:test'
import { gcTally } from '../../bench/profile.ts'
import { runBenchScript } from '../helpers/bench-script.ts'

interface ProfileReport {
  requests: number
  stream: boolean
  loopUsPerRequest: number
  sampledUsPerRequest: number
  gc: { collections: number; full: number; pauseUsPerRequest: number }
  stages: Record<string, number>
  functions: Record<string, number>
}

// `bun bench/profile.ts`: a router from this tree and the bare proxy under the profiler, for a
// second each. What is asserted is the attribution, not a speed: Tropa's samples fall in its
// lifecycle's stages, the bare proxy's in none of them.
test('the profile benchmark attributes a streamed request to the lifecycle stages, and the bare proxy to none', async () => {
  const { json: tropa } = await runBenchScript<ProfileReport>([
    'bench/profile.ts',
    '--seconds',
    '1',
    '--warmup',
    '0.5',
    '--stream',
    '--interval',
    '100',
  ])
  expect(tropa.stream).toBe(true)
  expect(tropa.requests).toBeGreaterThan(50)
  expect(tropa.loopUsPerRequest).toBeGreaterThan(0)
  expect(tropa.stages['relay and the lifecycle (pipeline/)']).toBeGreaterThan(0)
  expect(Object.keys(tropa.functions).some((f) => f.includes('src/upstream/sse.ts'))).toBe(true)

  const { json: bare } = await runBenchScript<ProfileReport>([
    'bench/profile.ts',
    '--seconds',
    '1',
    '--warmup',
    '0.5',
    '--bare',
    'relay',
  ])
  expect(bare.requests).toBeGreaterThan(50)
  expect(Object.keys(bare.stages).filter((s) => /src\/|pipeline|auth|route/.test(s))).toEqual([])
}, 60_000)

// Lines as Bun 1.4.5's JavaScriptCore writes them with BUN_JSC_logGC=true: three young
// collections and a full one are counted, with their pauses (every stop of the one marked
// concurrently, a line each); the other lines are not.
test("the GC tally reads JavaScriptCore's log: collections, full ones, pauses", () => {
  const log = [
    '[GC<0x530ad19c118>: starting 0.028343ms]',
    'Requesting GC because bytes allocated this cycle: 8392509 exceed bytes allowed: 8388608 normal bytes: 8392509 oversized bytes: 0 last oversized: 0',
    '[GC<0x530ad19c118>: START M 8880kb => EdenCollection, a=0kb hf=0.000 mu=0.600 v=0kb (C:0 M:0 P1:0) o=0 b=0 i#1:N<CsMsrShDMsm(0)SrbBcs> 745+0 => 263kb, p=0.637068ms (max 0.637068), cycle 0.609637ms END]',
    'GC END!',
    '[GC<0x530ad19c118>: START M 9100kb => EdenCollection, a=0kb v=0kb => 270kb, p=0.5ms (max 0.5), cycle 0.4ms END]',
    '[GC<0x530ad19c118>: START M 9300kb => FullCollection, a=0kb v=0kb => 200kb, p=2.25ms (max 2.25), cycle 2ms END]',
    '[GC<0x340b5828118>: START M 110351kb => EdenCollection, a=0kb hf=0.000 mu=0.600 v=0kb (C:0 M:0 P1:0) o=2104 b=770 i#1:N<CsMsrShDMsm(773)SrbBcs> 1904+0 p=5.337669ms (max 20.578617)...]',
    '[GC<0x340b5828118>: M a=289kb hf=0.008 mu=0.595 v=2355kb (C:257 M:0 P1:2097) o=1847 b=3 0+18 p=0.75ms (max 20.578617)...]',
    '[GC<0x340b5828118>: C a=12kb hf=0.008 mu=0.595 v=2400kb (C:257 M:0 P1:2097) o=1847 b=3 0+18 p=0.25ms (max 20.578617)...]',
    '[GC<0x340b5828118>: M a=289kb hf=0.008 mu=0.595 v=3212kb (C:257 M:0 P1:2954) o=2019 b=3 i#2:N<WsOJw>Pbc 170+18 v=3273kb o=2032 b=3 i#6:P<WsOJwCsShMsm(0)DBcsSrbMsrCbDomo>Pbc => 57573kb, p=8.220815ms (max 20.578617), cycle 27.123560ms END]',
    '[GC<0x530ad19c118>: epilogue 0.036734ms]',
    // two stops on one line (a collection with no mutator between them), then a line cut short
    '[GC<0x1>: START M 9000kb => EdenCollection, a=0kb v=0kb i#1:N<Cs> 0+0 p=1.5ms (max 1.5) v=1kb i#2:P<Ws> => 100kb, p=0.5ms (max 1.5), cycle 2ms END]',
    '[GC<0x1>: START M 9100kb => EdenCollection, a=0kb v=0kb (C:0 M:0',
  ].join('\n')
  const t = gcTally(log)
  expect({ cycles: t.cycles, full: t.full }).toEqual({ cycles: 5, full: 1 })
  expect(t.pauseMs).toBeCloseTo(0.637068 + 0.5 + 2.25 + 5.337669 + 0.75 + 0.25 + 8.220815 + 1.5 + 0.5, 9)
  expect(gcTally('')).toEqual({ cycles: 0, full: 0, pauseMs: 0 })
})
