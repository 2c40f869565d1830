import { expect, test } from 'bun:test'
import { progressLine } from '../../src/cli/batches.ts'

test('the progress line shows the share done, failures, rate and cost', () => {
  const b = {
    id: 'batch_x',
    status: 'in_progress',
    created_at: 0,
    request_counts: { total: 200, completed: 98, failed: 2 },
    cost_rub: 0.42,
    output_file_id: null,
    error_file_id: null,
  }
  expect(progressLine(b, 12.34, 10)).toBe(
    '[#####.....]  50% 100/200 done, 2 failed, 12.3 lines/s, 0.42 RUB, in_progress',
  )
  expect(progressLine({ ...b, request_counts: { total: 0, completed: 0, failed: 0 } }, 0, 4)).toBe(
    '[....]   0% 0/0 done, 0 failed, 0.0 lines/s, 0.42 RUB, in_progress',
  )
})
