import { describe, expect, test } from 'bun:test'
import { endStamp } from '../../src/batches/stamps.ts'

describe('a batch end stamp', () => {
  test('names the field of the final status', () => {
    expect(endStamp('completed', 1_000, 990)).toEqual({ completedAt: 1_000 })
    expect(endStamp('expired', 1_000, 990)).toEqual({ expiredAt: 1_000 })
    expect(endStamp('cancelled', 1_000, 990)).toEqual({ cancelledAt: 1_000 })
    expect(endStamp('failed', 1_000, 990)).toEqual({ failedAt: 1_000 })
  })

  test("is never before finalizing_at, stamped by the store's clock", () => {
    // This node's clock is 30 s behind the store's.
    expect(endStamp('completed', 970, 1_000)).toEqual({ completedAt: 1_000 })
    expect(endStamp('cancelled', 970, 1_000)).toEqual({ cancelledAt: 1_000 })
  })

  test('uses the node clock when the batch was never claimed for finalizing', () => {
    expect(endStamp('failed', 1_000, null)).toEqual({ failedAt: 1_000 })
  })
})
