import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { ADMIN_TOKEN, startTropa, type Tropa } from '../helpers/start.ts'

// The console's sign-in and API over plain HTTP: what the browser tests rely on, asserted header
// by header (cookie flags, CSRF, CSP), and the fleet API it shows.
let t: Tropa
beforeAll(async () => {
  t = await startTropa()
})
afterAll(() => t.stop())

const signIn = (token: string, headers: Record<string, string> = {}) =>
  fetch(`${t.url}/console/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ token }),
  })
const cookieOf = (r: Response) => (r.headers.get('set-cookie') ?? '').split(';')[0]!

describe('console sign-in', () => {
  test('/ redirects to /console, whose page has a strict CSP and no inline script', async () => {
    const r = await fetch(`${t.url}/`, { redirect: 'manual' })
    expect(r.status).toBe(302)
    expect(r.headers.get('location')).toBe('/console')
    const page = await fetch(`${t.url}/console`)
    expect(page.status).toBe(200)
    const csp = page.headers.get('content-security-policy') ?? ''
    expect(csp).toContain("default-src 'none'")
    expect(csp).toContain("script-src 'self'")
    expect(csp).not.toContain('unsafe')
    const html = await page.text()
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/)
    const refs = [...html.matchAll(/(?:src|href)="(\/console\/assets\/[^"]+)"/g)].map((m) => m[1]!)
    expect(refs.length).toBe(2)
    for (const ref of refs) {
      const a = await fetch(`${t.url}${ref}`)
      expect(a.status).toBe(200)
      expect(a.headers.get('cache-control')).toContain('immutable')
    }
    expect((await fetch(`${t.url}/console/assets/nope.js`)).status).toBe(404)
  })

  test('a master key signs in: an HttpOnly, SameSite=Strict cookie scoped to /console; not Secure over plain HTTP', async () => {
    const r = await signIn(t.masterKey)
    expect(r.status).toBe(201)
    const body = (await r.json()) as { role: string; organization: { id: string }; csrf_token: string }
    expect(body.role).toBe('organization')
    expect(body.organization.id).toBe(t.orgId)
    expect(body.csrf_token.length).toBeGreaterThan(20)
    const set = r.headers.get('set-cookie') ?? ''
    expect(set).toMatch(/^tropa_console=[0-9A-Za-z]{43};/)
    expect(set).toContain('HttpOnly')
    expect(set).toContain('SameSite=Strict')
    expect(set).toContain('Path=/console')
    expect(set).not.toContain('Secure')
    // The cookie is a random value, not the token.
    expect(set).not.toContain(t.masterKey)
  })

  test('behind a TLS proxy (x-forwarded-proto: https) the cookie is Secure', async () => {
    const r = await signIn(t.masterKey, { 'x-forwarded-proto': 'https' })
    expect(r.status).toBe(201)
    expect(r.headers.get('set-cookie')).toContain('; Secure')
  })

  test('a wrong token gets 401, an API key 403, a body without a token 400', async () => {
    const wrong = await signIn('mk-nope')
    expect(wrong.status).toBe(401)
    expect(wrong.headers.get('set-cookie')).toBeNull()
    const api = await signIn(t.apiKey)
    expect(api.status).toBe(403)
    expect(((await api.json()) as { error: { message: string } }).error.message).toContain('master key')
    const empty = await fetch(`${t.url}/console/session`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{}',
    })
    expect(empty.status).toBe(400)
    // Signing this browser in from another site (login CSRF): refused by Origin, and a body
    // without a content type (what a page elsewhere can send without a preflight) is refused too.
    const foreign = await signIn(t.masterKey, { origin: 'https://evil.example' })
    expect(foreign.status).toBe(403)
    expect(foreign.headers.get('set-cookie')).toBeNull()
    const untyped = await fetch(`${t.url}/console/session`, {
      method: 'POST',
      body: new Blob([JSON.stringify({ token: t.masterKey })]),
    })
    expect(untyped.status).toBe(415)
    expect(untyped.headers.get('set-cookie')).toBeNull()
    expect((await signIn(t.masterKey, { origin: t.url })).status).toBe(201)
  })

  test("the cookie calls /v1 as the master key; a write needs the session's CSRF token; logout revokes", async () => {
    const r = await signIn(t.masterKey)
    const cookie = cookieOf(r)
    const { csrf_token } = (await r.json()) as { csrf_token: string }
    const me = await fetch(`${t.url}/console/api/v1/organization`, { headers: { cookie } })
    expect(me.status).toBe(200)
    expect(((await me.json()) as { id: string }).id).toBe(t.orgId)
    expect((await fetch(`${t.url}/console/api/v1/organization`)).status).toBe(401)
    // The catalogue is readable from an organization's session.
    expect((await fetch(`${t.url}/console/api/v1/models`, { headers: { cookie } })).status).toBe(200)
    const create = (headers: Record<string, string>) =>
      fetch(`${t.url}/console/api/v1/keys`, {
        method: 'POST',
        headers: { cookie, 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ name: 'from-console' }),
      })
    const noCsrf = await create({})
    expect(noCsrf.status).toBe(403)
    expect(((await noCsrf.json()) as { error: { message: string } }).error.message).toContain('csrf')
    expect((await create({ 'x-csrf-token': 'x'.repeat(csrf_token.length) })).status).toBe(403)
    expect((await create({ 'x-csrf-token': csrf_token, origin: 'https://evil.example' })).status).toBe(403)
    const ok = await create({ 'x-csrf-token': csrf_token })
    expect(ok.status).toBe(201)
    const key = (await ok.json()) as { key: string }
    expect(key.key).toStartWith('sk-')
    // The key works through the public API with its secret.
    expect((await t.fetch('/v1/models', { key: key.key })).status).toBe(200)
    expect((await fetch(`${t.url}/console/session`, { method: 'DELETE', headers: { cookie } })).status).toBe(
      403,
    )
    const out = await fetch(`${t.url}/console/session`, {
      method: 'DELETE',
      headers: { cookie, 'x-csrf-token': csrf_token },
    })
    expect(out.status).toBe(200)
    expect(out.headers.get('set-cookie')).toContain('Max-Age=0')
    expect((await fetch(`${t.url}/console/api/v1/organization`, { headers: { cookie } })).status).toBe(401)
    expect(await (await fetch(`${t.url}/console/session`, { headers: { cookie } })).json()).toEqual({
      object: 'console.session',
      signed_in: false,
    })
  })

  test('a session ends when its master key is revoked, and after the idle time', async () => {
    const mk = await t.admin(`/v1/admin/organizations/${t.orgId}/master_keys`, { name: 'second' })
    const second = (await mk.json()) as { key: string; key_id: string }
    const cookie = cookieOf(await signIn(second.key))
    const signedIn = async (c: string) =>
      (
        (await (await fetch(`${t.url}/console/session`, { headers: { cookie: c } })).json()) as {
          signed_in: boolean
        }
      ).signed_in
    expect(await signedIn(cookie)).toBe(true)
    await t.admin(`/v1/admin/organizations/${t.orgId}/master_keys/${second.key_id}`, undefined, 'DELETE')
    expect(await signedIn(cookie)).toBe(false)
    expect((await fetch(`${t.url}/console/api/v1/keys`, { headers: { cookie } })).status).toBe(401)
    // Idle: the stored session is made older than console.session_idle_sec.
    const idle = cookieOf(await signIn(t.masterKey))
    const id = new Bun.CryptoHasher('sha256').update(idle.split('=')[1]!).digest('hex')
    await t.svc.store.touchConsoleSession(
      id,
      Math.floor(Date.now() / 1000) - t.svc.config.console.sessionIdleSec - 5,
    )
    expect(await signedIn(idle)).toBe(false)
    expect(await t.svc.store.getConsoleSession(id)).toBeUndefined()
  })
})

describe('calling with one of the organization API keys (x-console-key-id)', () => {
  test("a session may call model endpoints as its own active key; not as another organization's, nor as the operator", async () => {
    const r = await signIn(t.masterKey)
    const cookie = cookieOf(r)
    const { csrf_token } = (await r.json()) as { csrf_token: string }
    const keys = (await (await t.fetch('/v1/keys', { key: t.masterKey })).json()) as {
      data: { key_id: string; name: string }[]
    }
    const own = keys.data.find((k) => k.name === 'test')!.key_id
    const chat = (keyId: string, c = cookie, csrf = csrf_token) =>
      fetch(`${t.url}/console/api/v1/chat/completions`, {
        method: 'POST',
        headers: {
          cookie: c,
          'x-csrf-token': csrf,
          'x-console-key-id': keyId,
          'content-type': 'application/json',
        },
        body: JSON.stringify({ model: 'test/chat', messages: [{ role: 'user', content: 'hi' }] }),
      })
    const ok = await chat(own)
    expect(ok.status).toBe(200)
    expect(ok.headers.get('x-tropa-node')).toStartWith('sim-')
    // A stream passes through whole, to its [DONE], every time.
    for (let i = 0; i < 20; i++) {
      const streamed = await fetch(`${t.url}/console/api/v1/chat/completions`, {
        method: 'POST',
        headers: {
          cookie,
          'x-csrf-token': csrf_token,
          'x-console-key-id': own,
          'content-type': 'application/json',
        },
        body: JSON.stringify({
          model: 'test/chat',
          messages: [{ role: 'user', content: `stream ${i}` }],
          stream: true,
          stream_options: { include_usage: true },
        }),
      })
      expect(streamed.status).toBe(200)
      const text = await streamed.text()
      expect(text).toContain('"cost_rub"')
      expect(text.trimEnd()).toEndWith('data: [DONE]')
    }
    // Without a key the master key's own rule holds: 403 on model endpoints.
    const asMaster = await fetch(`${t.url}/console/api/v1/chat/completions`, {
      method: 'POST',
      headers: { cookie, 'x-csrf-token': csrf_token, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'test/chat', messages: [{ role: 'user', content: 'hi' }] }),
    })
    expect(asMaster.status).toBe(403)
    // Another organization's key is not found; a master key's id neither.
    const other = (await (
      await t.admin('/v1/admin/organizations', { name: 'other-org', balance_rub: 1 })
    ).json()) as {
      master_key: string
      master_key_id: string
    }
    const otherKey = (await (
      await t.fetch('/v1/keys', {
        method: 'POST',
        key: other.master_key,
        body: JSON.stringify({ name: 'x' }),
      })
    ).json()) as { key_id: string }
    expect((await chat(otherKey.key_id)).status).toBe(404)
    expect((await chat(other.master_key_id)).status).toBe(404)
    expect((await chat('key_nope')).status).toBe(404)
    // A revoked key gets its usual 401 (the session itself stays signed in).
    const gone = (await (
      await t.fetch('/v1/keys', { method: 'POST', key: t.masterKey, body: JSON.stringify({ name: 'gone' }) })
    ).json()) as { key_id: string }
    await t.fetch(`/v1/keys/${gone.key_id}`, { method: 'DELETE', key: t.masterKey })
    const revoked = await chat(gone.key_id)
    expect(revoked.status).toBe(401)
    expect(((await revoked.json()) as { error: { code: string } }).error.code).toBe('key_revoked')
    // The operator has no API keys to act as.
    const op = await signIn(ADMIN_TOKEN)
    const opCsrf = ((await op.json()) as { csrf_token: string }).csrf_token
    expect((await chat(own, cookieOf(op), opCsrf)).status).toBe(403)
  })
})

describe('operator', () => {
  test('the admin token signs in as operator; the fleet API lists every node with its live figures', async () => {
    const r = await signIn(ADMIN_TOKEN)
    expect(r.status).toBe(201)
    const body = (await r.json()) as { role: string; organization: null }
    expect(body.role).toBe('operator')
    expect(body.organization).toBeNull()
    const cookie = cookieOf(r)
    interface FleetNode {
      node: string
      healthy: boolean
      ejected: boolean
      in_flight: number
      requests: number
      ttft_ms: { p50: number | null; samples: number }
      prefill_tokens_per_sec: number | null
    }
    const fleet = async () => {
      const res = await fetch(`${t.url}/console/api/v1/admin/fleet`, { headers: { cookie } })
      expect(res.status).toBe(200)
      return new Map(((await res.json()) as { data: FleetNode[] }).data.map((n) => [n.node, n]))
    }
    const before = await fleet()
    const chat = await t.client().chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
    })
    for await (const _ of chat) {
      // drain
    }
    const after = await fleet()
    expect([...after.keys()].sort()).toEqual(['sim-1', 'sim-2', 'sim-3'])
    expect([...after.values()].every((n) => n.healthy && !n.ejected && n.in_flight === 0)).toBe(true)
    // The node that served the stream has one more request and one more first-token time.
    const served = [...after.values()].filter((n) => n.requests === before.get(n.node)!.requests + 1)
    expect(served.length).toBe(1)
    expect(served[0]!.ttft_ms.samples).toBe(before.get(served[0]!.node)!.ttft_ms.samples + 1)
    expect(served[0]!.ttft_ms.p50).toBeGreaterThanOrEqual(0)
    expect(served[0]!.prefill_tokens_per_sec).toBeGreaterThan(0)
    // Admin only: a master key (and its session) gets 403.
    expect((await t.fetch('/v1/admin/fleet', { key: t.masterKey })).status).toBe(403)
    const orgs = await fetch(`${t.url}/console/api/v1/admin/organizations`, { headers: { cookie } })
    expect(((await orgs.json()) as { data: { id: string }[] }).data.map((o) => o.id)).toContain(t.orgId)
  })
})

describe('console.enabled = false', () => {
  test('/, /console, its sign-in and its API answer 404; /v1 is unchanged', async () => {
    const off = await startTropa({ extra: { console: { enabled: false } } })
    try {
      expect((await fetch(`${off.url}/`, { redirect: 'manual' })).status).toBe(404)
      expect((await fetch(`${off.url}/console`)).status).toBe(404)
      const signIn = await fetch(`${off.url}/console/session`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ token: off.masterKey }),
      })
      expect(signIn.status).toBe(404)
      expect((await fetch(`${off.url}/console/api/v1/organization`)).status).toBe(404)
      expect((await off.fetch('/v1/organization', { key: off.masterKey })).status).toBe(200)
    } finally {
      await off.stop()
    }
  })
})
