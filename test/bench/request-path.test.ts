import { expect, test } from 'bun:test'
import type { RequestPathReport } from '../../bench/request-path.ts'
import { runBenchScript } from '../helpers/bench-script.ts'

// `bun bench/request-path.ts --quick .`: the working tree's whole app answers the stubbed
// pass-through requests (the script throws on any other status). No speed figure is asserted.
test('the request-path benchmark answers every request through the whole app and reports its CPU', async () => {
  const { out, json: r } = await runBenchScript<RequestPathReport>(['bench/request-path.ts', '--quick', '.'])
  expect(out).toContain('event-loop CPU per request')
  expect(r.trees).toHaveLength(1)
  expect(r.trees[0]!.medianUs).toBeGreaterThan(0)
  expect(r.ratios).toEqual([])
}, 30_000)
