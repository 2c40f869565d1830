import { expect, test } from 'bun:test'
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
  expect(tropa.gc.collections).toBeGreaterThanOrEqual(0)

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
