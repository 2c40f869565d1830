import { Elysia, t } from 'elysia'
import { CreateOrgBody, CreditBody, MasterKeyBody } from '../../api/keys.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst, requireAdmin } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'
import { keyView, orgView } from '../views.ts'
import { limitOf } from './keys.ts'

const OrgParams = t.Object({ org_id: t.String() })

/** Operator endpoints: organizations, balances, master keys. Admin token only. */
export const adminRoutes = (svc: Services) => {
  const auth = authenticateFirst(svc)
  const tags = ['admin']
  return new Elysia()
    .derive(authenticate(svc))
    .onBeforeHandle(({ principal }) => requireAdmin(principal))
    .post(
      '/v1/admin/organizations',
      async ({ body: raw, set }) => {
        const body = raw as CreateOrgBody
        const balance = limitOf(body.balance_rub, 'balance_rub') ?? 0n
        const org = await svc.identity.createOrg(body.name)
        if (balance > 0n) await svc.identity.credit(org, balance)
        const { key, secret } = await svc.identity.createKey(org, 'master', {
          name: 'master',
          limitNano: null,
        })
        set.status = 201
        return { ...orgView(org), master_key: secret, master_key_id: key.id }
      },
      {
        parse: jsonBody(64 * 1024, CreateOrgBody, auth),
        detail: {
          tags,
          summary: 'Create an organization with a balance and a master key',
          requestBody: jsonRequestBody(CreateOrgBody),
        },
      },
    )
    .get(
      '/v1/admin/organizations/:org_id',
      async ({ params }) => {
        const org = svc.identity.org(params.org_id)
        return orgView(org, await svc.identity.orgNow(org))
      },
      {
        params: OrgParams,
        detail: { tags, summary: 'An organization and its balance' },
      },
    )
    .post(
      '/v1/admin/organizations/:org_id/credit',
      async ({ params, body }) => {
        const org = svc.identity.org(params.org_id)
        await svc.identity.credit(org, limitOf((body as CreditBody).amount_rub, 'amount_rub')!)
        return orgView(org, await svc.identity.orgNow(org))
      },
      {
        parse: jsonBody(64 * 1024, CreditBody, auth),
        params: OrgParams,
        detail: {
          tags,
          summary: 'Top up a balance (ledger row kind credit)',
          requestBody: jsonRequestBody(CreditBody),
        },
      },
    )
    .post(
      '/v1/admin/organizations/:org_id/master_keys',
      async ({ params, body, set }) => {
        const org = svc.identity.org(params.org_id)
        const { key, secret } = await svc.identity.createKey(org, 'master', {
          name: (body as MasterKeyBody).name,
          limitNano: null,
        })
        set.status = 201
        return { ...keyView(key), key: secret }
      },
      {
        parse: jsonBody(64 * 1024, MasterKeyBody, auth),
        params: OrgParams,
        detail: { tags, summary: 'Issue another master key', requestBody: jsonRequestBody(MasterKeyBody) },
      },
    )
    .get(
      '/v1/admin/organizations/:org_id/master_keys',
      async ({ params }) => {
        const org = svc.identity.org(params.org_id)
        const rows = await svc.identity.listKeys({ orgId: org.id, kind: 'master', limit: 1000 })
        return { object: 'list', data: rows.map(keyView) }
      },
      { params: OrgParams, detail: { tags, summary: "An organization's master keys" } },
    )
    .delete(
      '/v1/admin/organizations/:org_id/master_keys/:key_id',
      async ({ params }) => {
        const key = svc.identity.key(svc.identity.org(params.org_id).id, params.key_id, 'master')
        await svc.identity.revokeKey(key)
        return { key_id: key.id, object: 'key.deleted', deleted: true }
      },
      {
        params: t.Object({ org_id: t.String(), key_id: t.String() }),
        detail: { tags, summary: 'Revoke a master key' },
      },
    )
    .post('/v1/admin/reload', () => ({ object: 'config.reload', ...svc.reload() }), {
      detail: {
        tags,
        summary:
          "Reload the config file's models, routes and prices (as SIGHUP does); 400 invalid_config lists every problem, and the running config stays",
      },
    })
}
