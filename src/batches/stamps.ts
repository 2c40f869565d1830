import type { BatchPatch, BatchStatus } from '../storage/store.ts'

/**
 * The timestamp that ends a batch (`completed_at`, `expired_at`, `cancelled_at` or `failed_at`),
 * in seconds. The node that writes the results stamps it by its own clock, but `finalizing_at` was
 * stamped by the store's (claimFinalize), so a node whose clock is behind the store's would end a
 * batch before it began finalizing: the end is never earlier than `finalizing_at`.
 */
export function endStamp(status: BatchStatus, nowSec: number, finalizingAt: number | null): BatchPatch {
  const at = Math.max(nowSec, finalizingAt ?? 0)
  switch (status) {
    case 'completed':
      return { completedAt: at }
    case 'expired':
      return { expiredAt: at }
    case 'cancelled':
      return { cancelledAt: at }
    default:
      return { failedAt: at }
  }
}
