import { Elysia, t } from 'elysia'
import { CreateWebhookBody, PatchWebhookBody } from '../../api/webhooks.ts'
import { nanoToRubNumber } from '../../billing/money.ts'
import type { Services } from '../../services.ts'
import type { WebhookEventRecord, WebhookRecord } from '../../storage/store.ts'
import { authenticate, authenticateFirst, keyManagerOrg } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'
import { queryInt } from '../query.ts'
import { limitOf } from './keys.ts'

const WebhookParams = t.Object({ webhook_id: t.String() })
const OrgQuery = t.Object({ org_id: t.Optional(t.String()) })

/** A webhook as the API shows it: never its secret (shown once, when created). */
export function webhookView(w: WebhookRecord) {
  return {
    id: w.id,
    object: 'webhook' as const,
    url: w.url,
    events: w.events,
    balance_threshold_rub: w.balanceThresholdNano === null ? null : nanoToRubNumber(w.balanceThresholdNano),
    enabled: w.enabled,
    created_at: w.createdAt,
  }
}

function deliveryView(e: WebhookEventRecord) {
  return {
    object: 'webhook.event' as const,
    id: e.eventId,
    type: e.type,
    status: e.status,
    attempts: e.attempts,
    created_at: Math.floor(e.createdAtMs / 1000),
    delivered_at: e.deliveredAtMs === null ? null : Math.floor(e.deliveredAtMs / 1000),
    next_attempt_at: e.status === 'pending' ? Math.floor(e.nextAttemptAtMs / 1000) : null,
    last_status: e.lastStatus,
    last_error: e.lastError,
    payload: JSON.parse(e.payload) as unknown,
  }
}

/** POST/GET/PATCH/DELETE /v1/webhooks: an organization's master key, or the admin with org_id. */
export const webhookRoutes = (svc: Services) => {
  const auth = authenticateFirst(svc)
  const tags = ['webhooks']
  return new Elysia()
    .derive(authenticate(svc))
    .post(
      '/v1/webhooks',
      async ({ principal, body: raw, set }) => {
        const body = raw as CreateWebhookBody
        const org = keyManagerOrg(svc, principal, body.org_id)
        const { webhook, secret } = await svc.webhooks.create(org, {
          url: body.url,
          events: body.events,
          balanceThresholdNano: limitOf(body.balance_threshold_rub, 'balance_threshold_rub') ?? null,
          enabled: body.enabled ?? true,
        })
        set.status = 201
        return { ...webhookView(webhook), secret }
      },
      {
        parse: jsonBody(64 * 1024, CreateWebhookBody, auth),
        detail: {
          tags,
          summary: 'Create a webhook (its signing secret is shown only here)',
          requestBody: jsonRequestBody(CreateWebhookBody),
        },
      },
    )
    .get(
      '/v1/webhooks',
      async ({ principal, query }) => {
        const org = keyManagerOrg(svc, principal, query.org_id)
        return { object: 'list', data: (await svc.webhooks.list(org)).map(webhookView) }
      },
      { query: OrgQuery, detail: { tags, summary: "The organization's webhooks" } },
    )
    .get(
      '/v1/webhooks/:webhook_id',
      async ({ principal, params, query }) =>
        webhookView(await svc.webhooks.get(keyManagerOrg(svc, principal, query.org_id), params.webhook_id)),
      { params: WebhookParams, query: OrgQuery, detail: { tags, summary: 'One webhook' } },
    )
    .patch(
      '/v1/webhooks/:webhook_id',
      async ({ principal, params, body: raw, query }) => {
        const body = raw as PatchWebhookBody
        const org = keyManagerOrg(svc, principal, query.org_id)
        const threshold = limitOf(body.balance_threshold_rub, 'balance_threshold_rub')
        return webhookView(
          await svc.webhooks.update(org, params.webhook_id, {
            ...(body.url !== undefined && { url: body.url }),
            ...(body.events !== undefined && { events: body.events }),
            ...(threshold !== undefined && { balanceThresholdNano: threshold }),
            ...(body.enabled !== undefined && { enabled: body.enabled }),
          }),
        )
      },
      {
        parse: jsonBody(64 * 1024, PatchWebhookBody, auth),
        params: WebhookParams,
        query: OrgQuery,
        detail: {
          tags,
          summary: "Change a webhook's URL, events or threshold; disable or enable it",
          requestBody: jsonRequestBody(PatchWebhookBody),
        },
      },
    )
    .delete(
      '/v1/webhooks/:webhook_id',
      async ({ principal, params, query }) => {
        await svc.webhooks.delete(keyManagerOrg(svc, principal, query.org_id), params.webhook_id)
        return { id: params.webhook_id, object: 'webhook.deleted', deleted: true }
      },
      {
        params: WebhookParams,
        query: OrgQuery,
        detail: { tags, summary: 'Delete a webhook and the events it has not received' },
      },
    )
    .get(
      '/v1/webhooks/:webhook_id/events',
      async ({ principal, params, query }) => {
        const org = keyManagerOrg(svc, principal, query.org_id)
        const limit = queryInt(query.limit, 'limit', 1, 1000) ?? 100
        const rows = await svc.webhooks.deliveries(org, params.webhook_id, limit)
        return { object: 'list', data: rows.map(deliveryView) }
      },
      {
        params: WebhookParams,
        query: t.Object({ org_id: t.Optional(t.String()), limit: t.Optional(t.String()) }),
        detail: { tags, summary: "A webhook's events, newest first: delivered, pending or given up" },
      },
    )
}
