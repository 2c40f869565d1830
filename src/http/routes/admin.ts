import { Elysia, t } from 'elysia'
import { CreateOrgBody, CreditBody, DebitBody, MasterKeyBody, PatchOrgBody } from '../../api/keys.ts'
import { PredictedTtft } from '../../routing/predicted.ts'
import type { Services } from '../../services.ts'
import type { ModelLimits, OrgPatch } from '../../storage/store.ts'
import { authenticate, authenticateFirst, requireAdmin } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'
import { keyView, orgView } from '../views.ts'
import { limitOf } from './keys.ts'
import { receiptsDisabled } from './receipts.ts'

const OrgParams = t.Object({ org_id: t.String() })

/** A figure for JSON: rounded to a thousandth, null when not known yet (NaN). */
const figure = (x: number | undefined) =>
  x === undefined || !Number.isFinite(x) ? null : Math.round(x * 1000) / 1000

/** GET /v1/admin/fleet: every node as the router sees it now (what /metrics exports, as JSON). */
function fleetView(svc: Services) {
  const now = Date.now()
  const { pool, policy } = svc.deps
  const learned = new Map(
    (policy instanceof PredictedTtft ? policy.snapshot(now) : []).map((f) => [f.node, f] as const),
  )
  const models = new Map<string, string[]>()
  for (const m of svc.config.models)
    for (const r of m.routes) models.set(r.baseUrl, [...(models.get(r.baseUrl) ?? []), m.id])
  const data = [...pool.nodes.values()].map((n) => {
    const f = learned.get(n.name)
    const ejected = now < n.ejectedUntilMs
    return {
      node: n.name,
      object: 'fleet.node' as const,
      models: models.get(n.baseUrl) ?? [],
      healthy: !ejected && n.consecutiveFailures === 0,
      ejected,
      ejected_until_ms: ejected ? n.ejectedUntilMs : null,
      in_flight: n.inFlight,
      batch_in_flight: n.batchInFlight,
      requests: n.requests,
      failures: n.failures,
      consecutive_failures: n.consecutiveFailures,
      ejections: n.ejections,
      prefill_tokens_per_sec: figure(f?.tokensPerSec),
      slowness: figure(f?.slowness),
      queued_prompt_tokens: f?.queuedTokens ?? null,
      decoding: f?.decoding ?? null,
      itl_ms: figure(f?.itlMs),
      rtt_ms: figure(f?.rttMs),
      ttft_ms: {
        p50: figure(f?.ttftP50Ms),
        p90: figure(f?.ttftP90Ms),
        p99: figure(f?.ttftP99Ms),
        samples: f?.ttftSamples ?? 0,
      },
    }
  })
  return { object: 'list', policy: svc.config.routing.policy, at_ms: now, data }
}

/** The rate limits of an organization's create or PATCH body, as the store keeps them. */
function orgLimits(body: PatchOrgBody): OrgPatch {
  const asked = body.model_limits
  let models: ModelLimits | null | undefined = asked === null ? null : undefined
  if (asked) {
    const out: Record<string, { rpm: number | null; tpm: number | null }> = {}
    for (const [entry, l] of Object.entries(asked)) out[entry] = { rpm: l.rpm ?? null, tpm: l.tpm ?? null }
    models = Object.keys(out).length > 0 ? out : null
  }
  return {
    ...(body.rpm_limit !== undefined && { rpmLimit: body.rpm_limit }),
    ...(body.tpm_limit !== undefined && { tpmLimit: body.tpm_limit }),
    ...(models !== undefined && { modelLimits: models }),
  }
}

/** Operator endpoints: organizations, balances, master keys. Admin token only. */
export const adminRoutes = (svc: Services) => {
  const auth = authenticateFirst(svc)
  const tags = ['admin']
  return new Elysia()
    .derive(authenticate(svc))
    .onBeforeHandle(({ principal }) => requireAdmin(principal))
    .get(
      '/v1/admin/organizations',
      async () => {
        const orgs = await svc.identity.listOrgs()
        const data = await Promise.all(orgs.map(async (o) => orgView(o, await svc.identity.orgNow(o))))
        return { object: 'list', data }
      },
      { detail: { tags, summary: 'Every organization and its balance, oldest first' } },
    )
    .get('/v1/admin/fleet', () => fleetView(svc), {
      detail: {
        tags,
        summary:
          "The upstream nodes' live state: health, breaker, load, learned prefill rate, ITL, RTT, recent TTFT",
      },
    })
    .post(
      '/v1/admin/organizations',
      async ({ body: raw, set }) => {
        const body = raw as CreateOrgBody
        const balance = limitOf(body.balance_rub, 'balance_rub') ?? 0n
        const org = await svc.identity.createOrg(body.name, undefined, orgLimits(body))
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
    .patch(
      '/v1/admin/organizations/:org_id',
      async ({ params, body }) => {
        const org = svc.identity.org(params.org_id)
        await svc.identity.updateOrg(org, orgLimits(body as PatchOrgBody))
        return orgView(org, await svc.identity.orgNow(org))
      },
      {
        parse: jsonBody(64 * 1024, PatchOrgBody, auth),
        params: OrgParams,
        detail: {
          tags,
          summary:
            "Set or clear an organization's rate limits: rpm_limit, tpm_limit, model_limits (null clears one)",
          requestBody: jsonRequestBody(PatchOrgBody),
        },
      },
    )
    .post(
      '/v1/admin/organizations/:org_id/credit',
      async ({ params, body }) => {
        const org = svc.identity.org(params.org_id)
        const b = body as CreditBody
        await svc.identity.credit(org, limitOf(b.amount_rub, 'amount_rub')!, b.reason ?? null)
        return orgView(org, await svc.identity.orgNow(org))
      },
      {
        parse: jsonBody(64 * 1024, CreditBody, auth),
        params: OrgParams,
        detail: {
          tags,
          summary: 'Top up a balance (ledger row kind credit, with an optional reason)',
          requestBody: jsonRequestBody(CreditBody),
        },
      },
    )
    .post(
      '/v1/admin/organizations/:org_id/debit',
      async ({ params, body }) => {
        const org = svc.identity.org(params.org_id)
        const b = body as DebitBody
        await svc.identity.credit(org, -limitOf(b.amount_rub, 'amount_rub')!, b.reason)
        return orgView(org, await svc.identity.orgNow(org))
      },
      {
        parse: jsonBody(64 * 1024, DebitBody, auth),
        params: OrgParams,
        detail: {
          tags,
          summary:
            'Take from a balance with a reason (ledger row kind credit, negative amount); 409 insufficient_balance past the balance',
          requestBody: jsonRequestBody(DebitBody),
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
        return { object: 'list', data: rows.map((k) => keyView(k)) }
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
    .post(
      '/v1/admin/receipt-keys/rotate',
      async () => {
        const receipts = svc.deps.receipts
        if (!receipts) throw receiptsDisabled()
        const kid = await receipts.rotate()
        return { object: 'receipt_keys', ...receipts.keySet(), current_kid: kid ?? null }
      },
      {
        detail: {
          tags,
          summary:
            'Rotate the receipt signing key: a new Ed25519 key signs from now on (every node of a cluster); the old ones stay published',
        },
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
