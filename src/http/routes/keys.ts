import { Elysia, t } from 'elysia'
import { type BudgetBody, CreateKeyBody, PatchKeyBody } from '../../api/keys.ts'
import { type Budget, isBudgetTimeZone } from '../../billing/budgets.ts'
import { MAX_AMOUNT_NANO, MAX_AMOUNT_RUB, type NanoRub, rubNumberToNano } from '../../billing/money.ts'
import { InvalidValue } from '../../errors.ts'
import type { LiveKey } from '../../identity/live.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst, keyManagerOrg } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'
import { queryEnum, queryInt } from '../query.ts'
import { keyView } from '../views.ts'

const KeyParams = t.Object({ key_id: t.String() })
// Query values are checked by queryInt/queryEnum: Elysia reports a query error without the
// parameter's name, and the OpenAI error body needs it in `param`.
const ListKeysQuery = t.Object({
  limit: t.Optional(t.String()),
  after: t.Optional(t.String()),
  status: t.Optional(t.String()),
  org_id: t.Optional(t.String()),
})

/**
 * An amount in roubles (limit_rub, balance_rub, amount_rub) as nano-roubles: null stays null (no
 * limit); more than six fractional digits or more than MAX_AMOUNT_RUB is refused.
 */
export function limitOf(value: number | null | undefined, param = 'limit_rub'): NanoRub | null | undefined {
  if (value === undefined || value === null) return value
  const nano = rubNumberToNano(value)
  if (nano === undefined) throw new InvalidValue(`${param} must have at most six fractional digits`, param)
  if (nano > MAX_AMOUNT_NANO) throw new InvalidValue(`${param} must be at most ${MAX_AMOUNT_RUB}`, param)
  return nano
}

/** A budget of the API as the key keeps it: null stays null (cleared); the zone is checked with Intl. */
export function budgetOf(b: BudgetBody | undefined, param: string): Budget | null | undefined {
  if (b === undefined || b === null) return b
  const timezone = b.timezone ?? 'UTC'
  if (!isBudgetTimeZone(timezone))
    throw new InvalidValue(
      'timezone must be an IANA time zone name, such as Europe/Moscow',
      `${param}.timezone`,
    )
  const amountNano = limitOf(b.amount_rub, `${param}.amount_rub`)!
  return { amountNano, period: b.period, timezone }
}

export const keyRoutes = (svc: Services) => {
  /** A key with where its period budget stands now (spend in the period and when it resets). */
  const viewNow = async (key: LiveKey) => keyView(key, await svc.identity.budgetNow(key))
  const auth = authenticateFirst(svc)
  const tags = ['keys']
  return new Elysia()
    .derive(authenticate(svc))
    .post(
      '/v1/keys',
      async ({ principal, body: raw, set }) => {
        const body = raw as CreateKeyBody
        const org = keyManagerOrg(svc, principal, body.org_id)
        const { key, secret } = await svc.identity.createKey(org, 'api', {
          name: body.name,
          limitNano: limitOf(body.limit_rub) ?? null,
          rpmLimit: body.rpm_limit ?? null,
          tpmLimit: body.tpm_limit ?? null,
          expiresAt: body.expires_at ?? null,
          models: body.models ?? null,
          maxConcurrency: body.max_concurrency ?? null,
          budget: budgetOf(body.budget, 'budget') ?? null,
          endUserBudget: budgetOf(body.end_user_budget, 'end_user_budget') ?? null,
        })
        set.status = 201
        return { ...(await viewNow(key)), key: secret }
      },
      {
        parse: jsonBody(64 * 1024, CreateKeyBody, auth),
        detail: {
          tags,
          summary: 'Create an API key (the secret is shown only here)',
          requestBody: jsonRequestBody(CreateKeyBody),
        },
      },
    )
    .get(
      '/v1/keys',
      async ({ principal, query }) => {
        const org = keyManagerOrg(svc, principal, query.org_id)
        const limit = queryInt(query.limit, 'limit', 1, 1000) ?? 100
        const status = queryEnum(query.status, 'status', ['active', 'disabled', 'revoked'] as const)
        const rows = await svc.identity.listKeys({
          orgId: org.id,
          kind: 'api',
          limit: limit + 1,
          ...(status && { status }),
          ...(query.after && { afterId: query.after }),
        })
        const data = await Promise.all(rows.slice(0, limit).map(viewNow))
        return {
          object: 'list',
          data,
          has_more: rows.length > limit,
          first_id: data[0]?.key_id ?? null,
          last_id: data.at(-1)?.key_id ?? null,
        }
      },
      { query: ListKeysQuery, detail: { tags, summary: 'List API keys (active, disabled and revoked)' } },
    )
    .get(
      '/v1/keys/:key_id',
      async ({ principal, params, query }) =>
        viewNow(
          await svc.identity.current(
            svc.identity.key(keyManagerOrg(svc, principal, query.org_id).id, params.key_id, 'api'),
          ),
        ),
      {
        params: KeyParams,
        query: t.Object({ org_id: t.Optional(t.String()) }),
        detail: { tags, summary: 'One API key' },
      },
    )
    .patch(
      '/v1/keys/:key_id',
      async ({ principal, params, body: raw, query }) => {
        const body = raw as PatchKeyBody
        const key = svc.identity.key(keyManagerOrg(svc, principal, query.org_id).id, params.key_id, 'api')
        const limitNano = limitOf(body.limit_rub)
        const budget = budgetOf(body.budget, 'budget')
        const endUserBudget = budgetOf(body.end_user_budget, 'end_user_budget')
        return viewNow(
          await svc.identity.updateKey(key, {
            ...(body.name !== undefined && { name: body.name }),
            ...(limitNano !== undefined && { limitNano }),
            ...(body.disabled !== undefined && { disabled: body.disabled }),
            ...(body.rpm_limit !== undefined && { rpmLimit: body.rpm_limit }),
            ...(body.tpm_limit !== undefined && { tpmLimit: body.tpm_limit }),
            ...(body.expires_at !== undefined && { expiresAt: body.expires_at }),
            ...(body.models !== undefined && { models: body.models }),
            ...(body.max_concurrency !== undefined && { maxConcurrency: body.max_concurrency }),
            ...(budget !== undefined && { budget }),
            ...(endUserBudget !== undefined && { endUserBudget }),
          }),
        )
      },
      {
        parse: jsonBody(64 * 1024, PatchKeyBody, auth),
        params: KeyParams,
        query: t.Object({ org_id: t.Optional(t.String()) }),
        detail: {
          tags,
          summary: 'Rename, change the limit, disable or enable a key',
          requestBody: jsonRequestBody(PatchKeyBody),
        },
      },
    )
    .delete(
      '/v1/keys/:key_id',
      async ({ principal, params, query }) => {
        const key = svc.identity.key(keyManagerOrg(svc, principal, query.org_id).id, params.key_id, 'api')
        await svc.identity.revokeKey(key)
        return { key_id: key.id, object: 'key.deleted', deleted: true }
      },
      {
        params: KeyParams,
        query: t.Object({ org_id: t.Optional(t.String()) }),
        detail: { tags, summary: 'Revoke a key: immediate and irreversible' },
      },
    )
}
