import { Elysia, t } from 'elysia'
import { nanoToRubNumber } from '../../billing/money.ts'
import {
  fractionalOffset,
  isTimeZone,
  seriesHours,
  type UsageSums,
  usageSeries,
} from '../../billing/usage-series.ts'
import { InvalidValue } from '../../errors.ts'
import type { Services } from '../../services.ts'
import { authenticate, keyManagerOrg, ledgerReader } from '../auth.ts'
import { queryEnum, queryInt } from '../query.ts'
import { orgView } from '../views.ts'

const DAY = 86_400
/** The longest series: 31 days of hours, 400 days of days. */
const MAX_HOURS = { hour: 31 * 24, day: 400 * 24 } as const

const sumsView = (s: UsageSums) => ({
  requests: s.requests,
  cost_rub: nanoToRubNumber(s.costNano),
  prompt_tokens: s.promptTokens,
  completion_tokens: s.completionTokens,
  cached_tokens: s.cachedTokens,
})

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
        const groupBy = queryEnum(query.group_by, 'group_by', ['end_user'] as const)
        const byEndUser = groupBy === 'end_user'
        const rows = await svc.store.usageByKeyModelDay(org.id, start * 1000, end * 1000, {
          endUser: query.end_user,
          byEndUser,
        })
        return {
          object: 'list',
          org_id: org.id,
          balance_rub: nanoToRubNumber((await svc.identity.orgNow(org)).balanceNano),
          start_time: start,
          end_time: end,
          ...(query.end_user !== undefined && { end_user: query.end_user }),
          data: rows.map((r) => ({
            key_id: r.keyId,
            model: r.model,
            day: r.day,
            ...(byEndUser && { end_user: r.endUser ?? null }),
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
            end_user: t.Optional(t.String()),
            group_by: t.Optional(t.String()),
            org_id: t.Optional(t.String()),
          },
          { additionalProperties: false },
        ),
        detail: {
          tags: ['usage'],
          summary:
            'Usage grouped by key, model and UTC day (and end user with group_by=end_user) over [start_time, end_time); end_user= filters',
        },
      },
    )
    .get(
      '/v1/usage/series',
      async ({ principal, query }) => {
        const scope = ledgerReader(svc, principal, query.org_id, query.key_id)
        const bucket = queryEnum(query.bucket, 'bucket', ['hour', 'day'] as const) ?? 'day'
        const groupBy = queryEnum(query.group_by, 'group_by', ['model', 'key'] as const) ?? null
        const tz = query.tz ?? 'UTC'
        if (!isTimeZone(tz))
          throw new InvalidValue('tz must be an IANA time zone name, such as Europe/Moscow', 'tz')
        const to = queryInt(query.to, 'to', 1) ?? Math.floor(Date.now() / 1000)
        const from = queryInt(query.from, 'from', 0) ?? to - (bucket === 'hour' ? 2 * DAY : 30 * DAY)
        if (from >= to) throw new InvalidValue('from must be before to', 'from')
        const { fromHour, toHour } = seriesHours(from, to, bucket, tz)
        if ((toHour - fromHour) / 3600 > MAX_HOURS[bucket])
          throw new InvalidValue(
            `a series of ${bucket} buckets covers at most ${MAX_HOURS[bucket] / 24} days`,
            'from',
          )
        if (fractionalOffset(tz, fromHour, toHour) !== undefined)
          throw new InvalidValue(
            'tz must keep whole-hour UTC offsets over the range (usage is kept per hour)',
            'tz',
          )
        await svc.ledger.flush()
        const hours = await svc.store.usageHours({
          orgId: scope.org.id,
          fromSec: fromHour,
          toSec: toHour,
          keyId: scope.keyId,
          model: query.model,
          groupBy,
        })
        const field = groupBy === 'key' ? 'key_id' : 'model'
        return {
          object: 'list',
          org_id: scope.org.id,
          bucket,
          group_by: groupBy,
          tz,
          from: fromHour,
          to: toHour,
          data: usageSeries(hours, fromHour, toHour, bucket, tz).map((p) => ({
            start: p.start,
            end: p.end,
            ...(p.date !== undefined && { date: p.date }),
            ...sumsView(p.total),
            ...(groupBy && {
              groups: [...p.groups].map(([id, sums]) => ({
                [field]: id,
                ...(groupBy === 'key' && {
                  key_name: id === null ? null : (svc.identity.keyById(id)?.name ?? null),
                }),
                ...sumsView(sums),
              })),
            }),
          })),
        }
      },
      {
        query: t.Object(
          {
            bucket: t.Optional(t.String()),
            group_by: t.Optional(t.String()),
            from: t.Optional(t.String()),
            to: t.Optional(t.String()),
            tz: t.Optional(t.String()),
            key_id: t.Optional(t.String()),
            model: t.Optional(t.String()),
            org_id: t.Optional(t.String()),
          },
          { additionalProperties: false },
        ),
        detail: {
          tags: ['usage'],
          summary: 'Spend, requests and tokens per hour or day (in tz), optionally by model or key',
        },
      },
    )
