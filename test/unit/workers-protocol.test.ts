import { expect, test } from 'bun:test'
import { RateLimited, TropaError } from '../../src/errors.ts'
import { mergeMetrics } from '../../src/workers/metrics.ts'
import { decodeError, encodeError } from '../../src/workers/protocol.ts'

test('an error crosses the channel as the same class with the same fields (the same HTTP answer)', () => {
  const limited = new RateLimited('slow down', 7, 'rate_limit_exceeded')
  const back = decodeError(structuredClone(encodeError(limited)))
  expect(back).toBeInstanceOf(RateLimited)
  expect(back).toBeInstanceOf(TropaError)
  const fields = (e: Error) => {
    const r = e as RateLimited
    return [r.name, r.message, r.status, r.type, r.code, r.param, r.retryAfterSec]
  }
  expect(fields(back)).toEqual(fields(limited))
  expect((back as RateLimited).retryable).toBe(limited.retryable)
  const plain = decodeError(encodeError(new Error('boom')))
  expect(plain.message).toBe('boom')
})

test("processes' metrics merge into one group per family, each series labelled with its worker", () => {
  const text =
    '# HELP a_total A.\n# TYPE a_total counter\na_total{node="x"} 1\n# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_sum 3\nh_count 2\n'
  const merged = mergeMetrics([
    { worker: 'primary', text },
    { worker: '0', text },
  ])
  expect(merged).toBe(
    [
      '# HELP a_total A.',
      '# TYPE a_total counter',
      'a_total{worker="primary",node="x"} 1',
      'a_total{worker="0",node="x"} 1',
      '# HELP h H.',
      '# TYPE h histogram',
      'h_bucket{worker="primary",le="1"} 2',
      'h_sum{worker="primary"} 3',
      'h_count{worker="primary"} 2',
      'h_bucket{worker="0",le="1"} 2',
      'h_sum{worker="0"} 3',
      'h_count{worker="0"} 2',
      '',
    ].join('\n'),
  )
})
