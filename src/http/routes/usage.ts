import { Elysia, t } from 'elysia'
import { nanoToRubNumber } from '../../billing/money.ts'
import { InvalidValue } from '../../errors.ts'
import type { Services } from '../../services.ts'
import { authenticate, keyManagerOrg } from '../auth.ts'
import { queryInt } from '../query.ts'
import { orgView } from '../views.ts'

const DAY = 86_400

/** An organization's balance and its usage by key, model and day: master key (own org) or admin. */
export const usageRoutes = (svc: Services) =>
  new Elysia()
    .derive(authenticate(svc))
    .get(
      '/v1/organization',
      async ({ principal, query }) => {
        const org = keyManagerOrg(svc, principal, query.org_id)
        return orgView(org, await svc.identity.orgNow(org))
      },
      {
        query: t.Object({ org_id: t.Optional(t.String()) }, { additionalProperties: false }),
        detail: { tags: ['usage'], summary: "The caller's organization and its balance" },
      },
    )
    .get(
      '/v1/usage',
      async ({ principal, query }) => {
        const org = keyManagerOrg(svc, principal, query.org_id)
        const end = queryInt(query.end_time, 'end_time', 1) ?? Math.floor(Date.now() / 1000) + 1
        const start = queryInt(query.start_time, 'start_time', 0) ?? end - 30 * DAY
        if (start >= end) throw new InvalidValue('start_time must be before end_time', 'start_time')
        // Rows not yet flushed would be missing from a read that follows a request at once.
        await svc.ledger.flush()
        const rows = await svc.store.usageByKeyModelDay(org.id, start * 1000, end * 1000)
        return {
          object: 'list',
          org_id: org.id,
          balance_rub: nanoToRubNumber((await svc.identity.orgNow(org)).balanceNano),
          start_time: start,
          end_time: end,
          data: rows.map((r) => ({
            key_id: r.keyId,
            model: r.model,
            day: r.day,
            requests: r.requests,
            prompt_tokens: r.promptTokens,
            completion_tokens: r.completionTokens,
            cost_rub: nanoToRubNumber(r.costNano),
          })),
        }
      },
      {
        query: t.Object(
          {
            start_time: t.Optional(t.String()),
            end_time: t.Optional(t.String()),
            org_id: t.Optional(t.String()),
          },
          { additionalProperties: false },
        ),
        detail: {
          tags: ['usage'],
          summary: 'Usage grouped by key, model and UTC day over [start_time, end_time)',
        },
      },
    )
