// The events a webhook may subscribe to (docs/api.md, "Webhooks"). A file of its own, with no
// imports, so that the console's browser code shares the list.

export const WEBHOOK_EVENT_TYPES = [
  'balance.below_threshold',
  'key.limit_80',
  'key.limit_100',
  'key.budget_80',
  'key.budget_100',
  'batch.completed',
  'batch.failed',
  'batch.expired',
] as const
export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number]
