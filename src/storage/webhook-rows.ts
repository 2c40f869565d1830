import type { NewWebhookEvent, WebhookEventRecord, WebhookEventStatus, WebhookRecord } from './store.ts'

export type { NewWebhookEvent }

/** A webhooks row as both stores' query builders return it (flags as integers). */
export function webhookRow(r: {
  id: string
  orgId: string
  url: string
  secret: string
  events: readonly string[]
  balanceThresholdNano: bigint | null
  enabled: number
  balanceBelow: number
  createdAt: number
}): WebhookRecord {
  return { ...r, enabled: r.enabled === 1, balanceBelow: r.balanceBelow === 1 }
}

const num = (v: unknown): number => Number(v)
const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v))

/** A webhook_events row from raw SQL (snake_case columns; integers as bigint, text or number). */
export function webhookEventRow(r: Record<string, unknown>): WebhookEventRecord {
  return {
    webhookId: String(r.webhook_id),
    eventId: String(r.event_id),
    orgId: String(r.org_id),
    type: String(r.type),
    payload: String(r.payload),
    createdAtMs: num(r.created_at_ms),
    status: String(r.status) as WebhookEventStatus,
    attempts: num(r.attempts),
    nextAttemptAtMs: num(r.next_attempt_at_ms),
    deliveredAtMs: numOrNull(r.delivered_at_ms),
    lastError: r.last_error === null || r.last_error === undefined ? null : String(r.last_error),
    lastStatus: numOrNull(r.last_status),
  }
}
