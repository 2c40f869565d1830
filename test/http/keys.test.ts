import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { ADMIN_TOKEN, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa
beforeAll(async () => {
  t = await startTropa()
})
afterAll(() => t.stop())

const ask = (key: string) =>
  t.client(key).chat.completions.create({
    model: 'test/chat',
    messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 3,
  })

interface KeyRecord {
  key_id: string
  name: string
  key?: string
  key_hint: string
  limit_rub: number | null
  spent_rub: number
  status: string
  created_at: number
  last_used_at: number | null
  revoked_at: number | null
}

describe('keys API', () => {
  test('create returns the secret once; list and get show only the hint', async () => {
    const res = await t.fetch('/v1/keys', {
      method: 'POST',
      key: t.masterKey,
      body: JSON.stringify({ name: 'ci', limit_rub: 12.5 }),
    })
    expect(res.status).toBe(201)
    const created = (await res.json()) as KeyRecord
    expect(created.key).toMatch(/^sk-[0-9A-Za-z]{43}$/)
    expect(created.key_id).toMatch(/^key_[0-9a-z]{26}$/)
    expect(created).toMatchObject({ name: 'ci', limit_rub: 12.5, status: 'active', spent_rub: 0 })
    expect(created.key_hint).toBe(`sk-…${created.key!.slice(-4)}`)
    expect(Math.abs(created.created_at - Date.now() / 1000)).toBeLessThan(5)

    const list = (await (await t.fetch('/v1/keys', { key: t.masterKey })).json()) as {
      object: string
      data: KeyRecord[]
    }
    expect(list.object).toBe('list')
    const listed = list.data.find((k) => k.key_id === created.key_id)!
    expect(listed.key).toBeUndefined()
    expect(JSON.stringify(list)).not.toContain(created.key!)
    expect(listed).toMatchObject({
      key_hint: created.key_hint,
      limit_rub: 12.5,
      spent_rub: 0,
      last_used_at: null,
    })

    const one = (await (
      await t.fetch(`/v1/keys/${created.key_id}`, { key: t.masterKey })
    ).json()) as KeyRecord
    expect(one.key).toBeUndefined()
    expect(one.name).toBe('ci')
  })

  test('a new key works; last_used_at and spent_rub move after use', async () => {
    const k = await newApiKey(t, { name: 'user' })
    const r = await ask(k.key)
    expect(r.choices.length).toBe(1)
    await t.svc.ledger.flush()
    const rec = (await (await t.fetch(`/v1/keys/${k.key_id}`, { key: t.masterKey })).json()) as KeyRecord
    expect(rec.last_used_at).not.toBeNull()
    expect(rec.spent_rub).toBeGreaterThan(0)
  })

  test('revoke: 200 {key_id, deleted}, 401 from the next request, still listed as revoked, idempotent', async () => {
    const k = await newApiKey(t, { name: 'doomed' })
    await ask(k.key)
    const del = await t.fetch(`/v1/keys/${k.key_id}`, { method: 'DELETE', key: t.masterKey })
    expect(del.status).toBe(200)
    expect(await del.json()).toMatchObject({ key_id: k.key_id, deleted: true })
    const err = await ask(k.key).catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError)
    expect(err.status).toBe(401)
    const again = await t.fetch(`/v1/keys/${k.key_id}`, { method: 'DELETE', key: t.masterKey })
    expect(again.status).toBe(200)
    const list = (await (await t.fetch('/v1/keys?status=revoked', { key: t.masterKey })).json()) as {
      data: KeyRecord[]
    }
    const rec = list.data.find((x) => x.key_id === k.key_id)!
    expect(rec.status).toBe('revoked')
    expect(rec.revoked_at).not.toBeNull()
  })

  test('disable and enable with PATCH', async () => {
    const k = await newApiKey(t, { name: 'pausable' })
    const patch = (body: unknown) =>
      t.fetch(`/v1/keys/${k.key_id}`, { method: 'PATCH', key: t.masterKey, body: JSON.stringify(body) })
    expect((await patch({ disabled: true })).status).toBe(200)
    const err = await ask(k.key).catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError)
    expect(err.code).toBe('key_disabled')
    const back = (await (
      await patch({ disabled: false, name: 'renamed', limit_rub: null })
    ).json()) as KeyRecord
    expect(back).toMatchObject({ status: 'active', name: 'renamed', limit_rub: null })
    expect((await ask(k.key)).choices.length).toBe(1)
  })

  test('paging with limit and after', async () => {
    for (let i = 0; i < 3; i++) await newApiKey(t, { name: `page-${i}` })
    const all = (await (await t.fetch('/v1/keys?limit=1000', { key: t.masterKey })).json()) as {
      data: KeyRecord[]
    }
    const page1 = (await (await t.fetch('/v1/keys?limit=2', { key: t.masterKey })).json()) as {
      data: KeyRecord[]
      has_more: boolean
      last_id: string
    }
    expect(page1.data.length).toBe(2)
    expect(page1.has_more).toBe(true)
    const page2 = (await (
      await t.fetch(`/v1/keys?limit=2&after=${page1.last_id}`, { key: t.masterKey })
    ).json()) as { data: KeyRecord[] }
    expect(page2.data.map((k) => k.key_id)).toEqual(all.data.slice(2, 4).map((k) => k.key_id))
  })

  test('master key on a model endpoint: 403; API key on /v1/keys: 403', async () => {
    expect((await t.fetch('/v1/models', { key: t.masterKey })).status).toBe(403)
    expect((await t.fetch('/v1/keys', { key: t.apiKey })).status).toBe(403)
    expect((await t.fetch('/v1/keys', { key: t.apiKey, method: 'POST', body: '{"name":"x"}' })).status).toBe(
      403,
    )
  })

  test("another organization's key is 404 for this org's master key", async () => {
    const res = await t.admin('/v1/admin/organizations', { name: 'other-org', balance_rub: 5 })
    expect(res.status).toBe(201)
    const other = (await res.json()) as { id: string; master_key: string; balance_rub: number }
    expect(other.balance_rub).toBe(5)
    const theirs = await t.fetch('/v1/keys', {
      method: 'POST',
      key: other.master_key,
      body: JSON.stringify({ name: 'theirs' }),
    })
    const theirKey = (await theirs.json()) as KeyRecord
    for (const method of ['GET', 'PATCH', 'DELETE']) {
      const r = await t.fetch(`/v1/keys/${theirKey.key_id}`, {
        method,
        key: t.masterKey,
        ...(method === 'PATCH' && { body: '{"name":"mine"}' }),
      })
      expect(r.status).toBe(404)
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe('key_not_found')
    }
    // and it does not show in this org's list
    const list = (await (await t.fetch('/v1/keys?limit=1000', { key: t.masterKey })).json()) as {
      data: KeyRecord[]
    }
    expect(list.data.some((k) => k.key_id === theirKey.key_id)).toBe(false)
  })

  test('the admin token manages any org by org_id, and credits balances', async () => {
    const create = await fetch(`${t.url}/v1/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'by-admin', org_id: t.orgId }),
    })
    expect(create.status).toBe(201)
    const before = (await (await t.admin(`/v1/admin/organizations/${t.orgId}`)).json()) as {
      balance_rub: number
    }
    const after = (await (
      await t.admin(`/v1/admin/organizations/${t.orgId}/credit`, { amount_rub: 2.5 })
    ).json()) as {
      balance_rub: number
    }
    expect(after.balance_rub).toBeCloseTo(before.balance_rub + 2.5, 6)
    const missing = await t.admin('/v1/admin/organizations/org_nope')
    expect(missing.status).toBe(404)
  })

  test('amounts past one billion roubles get 400 and change nothing (money stays a 64-bit integer)', async () => {
    const refused = await t.admin('/v1/admin/organizations', { name: 'too-rich', balance_rub: 1e20 })
    expect(refused.status).toBe(400)
    // Refused before anything was created: the name is still free.
    const org = await t.admin('/v1/admin/organizations', { name: 'too-rich', balance_rub: 999_999_999 })
    expect(org.status).toBe(201)
    const { id } = (await org.json()) as { id: string }
    const over = await t.admin(`/v1/admin/organizations/${id}/credit`, { amount_rub: 1.000001 })
    expect(over.status).toBe(400)
    expect(((await over.json()) as { error: { code: string } }).error.code).toBe('invalid_value')
    const upToCap = await t.admin(`/v1/admin/organizations/${id}/credit`, { amount_rub: 1 })
    expect(upToCap.status).toBe(200)
    const view = (await (await t.admin(`/v1/admin/organizations/${id}`)).json()) as { balance_rub: number }
    expect(view.balance_rub).toBe(1_000_000_000)
    // The stored balance is that integer too (no float crept in): a restart-free read from the store.
    const stored = (await t.svc.store.loadOrgs()).find((o) => o.id === id)
    expect(stored?.balanceNano).toBe(1_000_000_000n * 1_000_000_000n)
  })

  test('the admin lists and revokes master keys; a revoked master key gets 401', async () => {
    const issued = await t.admin(`/v1/admin/organizations/${t.orgId}/master_keys`, { name: 'second' })
    const mk = (await issued.json()) as { key_id: string; key: string }
    expect(mk.key).toMatch(/^mk-/)
    const list = (await (await t.admin(`/v1/admin/organizations/${t.orgId}/master_keys`)).json()) as {
      data: { key_id: string }[]
    }
    expect(list.data.map((k) => k.key_id)).toContain(mk.key_id)
    expect((await t.fetch('/v1/keys', { key: mk.key })).status).toBe(200)
    const del = await t.admin(
      `/v1/admin/organizations/${t.orgId}/master_keys/${mk.key_id}`,
      undefined,
      'DELETE',
    )
    expect(del.status).toBe(200)
    expect((await t.fetch('/v1/keys', { key: mk.key })).status).toBe(401)
  })
})
