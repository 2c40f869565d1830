import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startSimFleet } from '../../src/simulator/index.ts'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN, defaultModels, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

// Hardening, defect 1: a deeply nested or huge body is refused by Tropa's own validation path in
// bounded time, whatever the route and whatever NODE_ENV says, and never stalls other tenants.

const deep = (d: number) => '['.repeat(d) + ']'.repeat(d)
const deepObj = (d: number) => `${'{"a":'.repeat(d)}1${'}'.repeat(d)}`
const hi = [{ role: 'user', content: 'hi' }]

let t: Tropa
let otherKey: string
beforeAll(async () => {
  t = await startTropa({ maxBodyBytes: 40 * 1024 * 1024 })
  // Another organization: its /health and chat must stay responsive during the attack.
  const org = (await (
    await t.admin('/v1/admin/organizations', { name: 'bystander', balance_rub: 100 })
  ).json()) as { master_key: string }
  otherKey = (await newApiKey(t, { name: 'other' }, org.master_key)).key
})
afterAll(() => t.stop())

interface Attack {
  name: string
  path: string
  body: string
  key?: 'api' | 'master' | 'admin' | 'broke'
  method?: string
}

const ATTACKS: Attack[] = [
  {
    name: 'chat: messages 20,000 arrays deep (40 KB)',
    path: '/v1/chat/completions',
    body: `{"model":"test/chat","messages":${deep(20_000)}}`,
  },
  {
    name: 'chat: messages 100,000 arrays deep',
    path: '/v1/chat/completions',
    body: `{"model":"test/chat","messages":${deep(100_000)}}`,
  },
  {
    name: 'chat: an unknown pass-through field 5,000 objects deep',
    path: '/v1/chat/completions',
    body: `{"model":"test/chat","messages":${JSON.stringify(hi)},"extra":${deepObj(5_000)}}`,
  },
  {
    name: 'chat: tool parameters 1,000 deep',
    path: '/v1/chat/completions',
    body: `{"model":"test/chat","messages":${JSON.stringify(hi)},"tools":[{"type":"function","function":{"name":"f","parameters":${deepObj(1_000)}}}]}`,
  },
  {
    name: 'embeddings: input 20,000 deep',
    path: '/v1/embeddings',
    body: `{"model":"test/embed","input":${deep(20_000)}}`,
  },
  { name: 'keys: name 20,000 deep', path: '/v1/keys', body: `{"name":${deep(20_000)}}`, key: 'master' },
  {
    name: 'admin: organization name 20,000 deep',
    path: '/v1/admin/organizations',
    body: `{"name":${deep(20_000)}}`,
    key: 'admin',
  },
  {
    name: 'admin: master key name 5,000 deep',
    path: '/v1/admin/organizations/ORG/master_keys',
    body: `{"name":${deep(5_000)}}`,
    key: 'admin',
  },
  {
    name: 'batches: input_file_id 20,000 deep',
    path: '/v1/batches',
    body: `{"input_file_id":${deep(20_000)}}`,
  },
  {
    name: 'a key with no balance gets the same 400',
    path: '/v1/chat/completions',
    body: `{"model":"test/chat","messages":${deep(20_000)}}`,
    key: 'broke',
  },
]

describe('deeply nested bodies are refused at once', () => {
  for (const a of ATTACKS)
    test(a.name, async () => {
      const key =
        a.key === 'master'
          ? t.masterKey
          : a.key === 'admin'
            ? ADMIN_TOKEN
            : a.key === 'broke'
              ? await brokeKey()
              : t.apiKey
      const t0 = performance.now()
      const res = await fetch(`${t.url}${a.path.replace('ORG', t.orgId)}`, {
        method: a.method ?? 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: a.body,
      })
      const ms = performance.now() - t0
      expect(res.status).toBe(400)
      const err = ((await res.json()) as { error: { code: string; message: string; type: string } }).error
      expect(err.type).toBe('invalid_request_error')
      expect(err.code).toBe('invalid_value')
      expect(err.message).toContain('deeper than 64 levels')
      // Before: 29 s for 20,000 levels. The bound is loose for a loaded CI machine.
      expect(ms).toBeLessThan(500)
    })
})

let broke: string | undefined
async function brokeKey(): Promise<string> {
  if (broke) return broke
  const org = (await (
    await t.admin('/v1/admin/organizations', { name: 'broke', balance_rub: 0 })
  ).json()) as {
    master_key: string
  }
  broke = (await newApiKey(t, { name: 'broke' }, org.master_key)).key
  return broke
}

test('64 levels pass (a deep tool schema is a real request), 65 do not', async () => {
  const at = (d: number) =>
    t.fetch('/v1/chat/completions', {
      method: 'POST',
      // messages array + object = 2 levels, the body itself 1, so the extra field adds d - 3.
      body: `{"model":"test/chat","max_tokens":2,"messages":${JSON.stringify(hi)},"extra":${deep(d - 1)}}`,
    })
  const ok = await at(64)
  expect(ok.status).toBe(200)
  await ok.text()
  const refused = await at(65)
  expect(refused.status).toBe(400)
  await refused.text()
})

test('a 30 MB body with one bad field is refused naming the field, never echoing the body', async () => {
  const body = JSON.stringify({
    model: 'test/chat',
    messages: hi,
    temperature: 'hot',
    pad: 'a'.repeat(30_000_000),
  })
  const res = await t.fetch('/v1/chat/completions', { method: 'POST', body })
  expect(res.status).toBe(400)
  const text = await res.text()
  expect(text.length).toBeLessThan(1000)
  const err = (JSON.parse(text) as { error: { param: string; message: string } }).error
  expect(err.param).toBe('temperature')
  expect(err.message).toBe('temperature: must be a number or null')
})

test('another tenant is served while nested bodies arrive', async () => {
  let stop = false
  const attacker = (async () => {
    let n = 0
    while (!stop) {
      const r = await t.fetch('/v1/chat/completions', {
        method: 'POST',
        body: `{"model":"test/chat","messages":${deep(100_000)}}`,
      })
      await r.text()
      n++
    }
    return n
  })()
  const health: number[] = []
  const chats: number[] = []
  const other = t.client(otherKey)
  for (let i = 0; i < 40; i++) {
    let t0 = performance.now()
    expect((await fetch(`${t.url}/health`)).status).toBe(200)
    health.push(performance.now() - t0)
    t0 = performance.now()
    await other.chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 2,
    })
    chats.push(performance.now() - t0)
  }
  stop = true
  expect(await attacker).toBeGreaterThan(5)
  const p99 = (xs: number[]) => xs.sort((a, b) => a - b)[Math.ceil(xs.length * 0.99) - 1]!
  expect(p99(health)).toBeLessThan(100)
  expect(p99(chats)).toBeLessThan(100)
})

describe('defect 5: messages say what is expected', () => {
  test.each([
    [{ max_tokens: 1.5 }, 'max_tokens', 'max_tokens: must be an integer or null'],
    [
      { max_completion_tokens: 'x' },
      'max_completion_tokens',
      'max_completion_tokens: must be an integer or null',
    ],
    [{ stream: 'yes' }, 'stream', 'stream: expected boolean'],
    [{ tool_choice: 7 }, 'tool_choice', 'tool_choice: must be "none", "auto", "required" or an object'],
  ])('%j', async (extra, param, message) => {
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', messages: hi, ...extra }),
    })
    expect(res.status).toBe(400)
    const err = ((await res.json()) as { error: { param: string; message: string } }).error
    expect(err.param).toBe(param)
    expect(err.message).toBe(message)
  })

  test("a master key naming another organization's org_id gets a 400, not silence", async () => {
    const res = await t.fetch('/v1/keys', {
      method: 'POST',
      key: t.masterKey,
      body: JSON.stringify({ name: 'x', org_id: 'org_someone_else' }),
    })
    expect(res.status).toBe(400)
    expect(((await res.json()) as { error: { param: string } }).error.param).toBe('org_id')
    const own = await t.fetch('/v1/keys', {
      method: 'POST',
      key: t.masterKey,
      body: JSON.stringify({ name: 'x', org_id: t.orgId }),
    })
    expect(own.status).toBe(201)
  })
})

describe('the same refusal whatever NODE_ENV says', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-nodeenv-'))
  let fleet: Awaited<ReturnType<typeof startSimFleet>>
  beforeAll(async () => {
    fleet = await startSimFleet([{ name: 'sim-1', seed: 1 }])
  })
  afterAll(async () => {
    await fleet.stop()
    rmSync(dir, { recursive: true, force: true })
  })
  for (const [i, env] of (
    [{}, { NODE_ENV: 'production' }, { NODE_ENV: 'development' }] as Record<string, string>[]
  ).entries())
    test(`NODE_ENV ${JSON.stringify(env)}`, async () => {
      const config = join(dir, `tropa-${i}.json`)
      writeFileSync(
        config,
        JSON.stringify({
          server: { data_dir: join(dir, String(i)), admin_token: ADMIN_TOKEN, log_level: 'error' },
          models: defaultModels(fleet.nodes),
        }),
      )
      const { proc, url } = await startRouterProcess(config, freePort(), env)
      try {
        const org = await jsonCall(url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'e', balance_rub: 1 })
        const key = await jsonCall(url, '/v1/keys', org.master_key as string, { name: 'k' })
        const t0 = performance.now()
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key.key}`, 'content-type': 'application/json' },
          body: `{"model":"test/chat","messages":${deep(20_000)}}`,
        })
        expect(res.status).toBe(400)
        expect(((await res.json()) as { error: { code: string } }).error.code).toBe('invalid_value')
        expect(performance.now() - t0).toBeLessThan(500)
        const bad = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key.key}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'test/chat', messages: hi, max_tokens: 1.5 }),
        })
        expect(await bad.json()).toEqual({
          error: {
            message: 'max_tokens: must be an integer or null',
            type: 'invalid_request_error',
            param: 'max_tokens',
            code: 'invalid_value',
          },
        })
      } finally {
        proc.kill()
        await proc.exited
      }
    })
})
