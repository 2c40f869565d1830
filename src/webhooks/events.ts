import { createHmac } from 'node:crypto'

import type { WebhookEventType } from './event-types.ts'

/**
 * An event's id from what happened, the same on every node that sees it (`key.limit_80:<key>:<limit>`),
 * so the outbox's unique (webhook, event id) keeps one row however many nodes notice it.
 */
export function eventId(what: string): string {
  return `evt_${new Bun.CryptoHasher('sha256').update(what).digest('hex').slice(0, 32)}`
}

/** The body every delivery of an event carries (Stripe's shape). */
export function eventPayload(
  id: string,
  type: WebhookEventType,
  orgId: string,
  createdAtMs: number,
  data: Record<string, unknown>,
): string {
  return JSON.stringify({
    id,
    object: 'event',
    type,
    created: Math.floor(createdAtMs / 1000),
    organization: orgId,
    data,
  })
}

/**
 * The `tropa-signature` header: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed by
 * the webhook's secret>`, as Stripe signs. A receiver recomputes v1 and compares in constant time,
 * and refuses a t too far from its clock (a replay).
 */
export function signatureHeader(secret: string, tSec: number, body: string): string {
  const v1 = createHmac('sha256', secret).update(`${tSec}.${body}`).digest('hex')
  return `t=${tSec},v1=${v1}`
}
