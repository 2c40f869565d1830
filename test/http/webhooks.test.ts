import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { webhookUrl } from '../../src/webhooks/urls.ts'
import { startChatBatch } from '../helpers/batches.ts'
import { newApiKey, startTropa, type Tropa } from '../helpers/start.ts'
import { type Receiver, signatureValid, startReceiver, until } from '../helpers/webhook-receiver.ts'

const WEBHOOKS = {
  poll_ms: 20,
  retry_base_ms: 50,
  retry_max_ms: 200,
  timeout_ms: 2000,
  allow_private_urls: true,
}

interface Created {
  id: string
  secret: string
  url: string
  events: string[]
  balance_threshold_rub: number | null
  enabled: boolean
}

async function createWebhook(t: Tropa, body: Record<string, unknown>, key = t.masterKey) {
  const res = await t.fetch('/v1/webhooks', { method: 'POST', key, body: JSON.stringify(body) })
  return {
    status: res.status,
    body: (await res.json()) as Created & { error?: { code: string; param: string } },
  }
}

/** Chat requests with the key until one is refused for its limit (402); how many were answered. */
async function spendUntilRefused(client: OpenAI, max = 200): Promise<number> {
  for (let i = 0; i < max; i++) {
    try {
      await client.chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: `spend ${i}` }],
        max_tokens: 40,
      })
    } catch (err) {
      if (err instanceof OpenAI.APIError && err.status === 402) return i
      throw err
    }
  }
  throw new Error('the limit was never reached')
}

/** Every delivery's signature verifies with the secret and its id matches the body's. */
function expectSigned(r: Receiver, secret: string) {
  expect(r.deliveries.length).toBeGreaterThan(0)
  for (const d of r.deliveries) {
    expect(signatureValid(secret, d.signature, d.body)).toBe(true)
    expect(signatureValid(`${secret}x`, d.signature, d.body)).toBe(false)
    expect(signatureValid(secret, d.signature, `${d.body} `)).toBe(false)
    expect(d.payload.id).toBe(d.eventId)
    expect(d.payload.type).toBe(d.type)
  }
}

test('webhook URLs: http(s) only, no credentials; loopback and private addresses only when allowed', () => {
  expect(webhookUrl('https://hooks.example.com/x?y=1', false)).toBe('https://hooks.example.com/x?y=1')
  for (const bad of [
    'ftp://example.com/',
    'not a url',
    'https://u:p@example.com/',
    'http://127.0.0.1:9/',
    'http://localhost/',
    'http://10.1.2.3/',
    'http://192.168.0.1/',
    'http://172.20.0.1/',
    'http://169.254.169.254/latest/meta-data',
    'http://[::1]/',
    'http://[::ffff:127.0.0.1]/',
    'http://[fd00::1]/',
  ])
    expect(() => webhookUrl(bad, false)).toThrow()
  expect(webhookUrl('http://127.0.0.1:9/', true)).toBe('http://127.0.0.1:9/')
})

describe.each([['sqlite'], ['postgres']])('webhooks on %s', (store) => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({
      postgres: store === 'postgres',
      balanceRub: 1,
      extra: { webhooks: WEBHOOKS },
    })
  })
  afterAll(() => t.stop())

  test('managed through the API: the secret is shown once; bodies are checked; another org sees none', async () => {
    const r = startReceiver()
    try {
      const bad = [
        [{ url: 'ftp://x/', events: ['key.limit_80'] }, 'url'],
        [{ url: r.url, events: [] }, 'events'],
        [{ url: r.url, events: ['key.limit_81'] }, 'events'],
        [{ url: r.url, events: ['balance.below_threshold'] }, 'balance_threshold_rub'],
        [{ url: r.url, events: ['key.limit_80'], balance_threshold_rub: 0.0000001 }, 'balance_threshold_rub'],
        [{ url: r.url, events: ['key.limit_80'], extra: 1 }, null],
      ] as const
      for (const [body] of bad) expect((await createWebhook(t, body)).status).toBe(400)
      expect((await createWebhook(t, { url: r.url, events: ['key.limit_80'] }, t.apiKey)).status).toBe(403)

      const made = await createWebhook(t, { url: r.url, events: ['key.limit_80', 'key.limit_80'] })
      expect(made.status).toBe(201)
      expect(made.body.secret).toMatch(/^whsec_[A-Za-z0-9]{32}$/)
      expect(made.body.events).toEqual(['key.limit_80'])
      const one = (await (
        await t.fetch(`/v1/webhooks/${made.body.id}`, { key: t.masterKey })
      ).json()) as Created
      expect(one.secret).toBeUndefined()
      expect(one.url).toBe(r.url)
      const patched = await t.fetch(`/v1/webhooks/${made.body.id}`, {
        method: 'PATCH',
        key: t.masterKey,
        body: JSON.stringify({ enabled: false, events: ['batch.failed'] }),
      })
      expect(patched.status).toBe(200)
      expect(await patched.json()).toMatchObject({ enabled: false, events: ['batch.failed'] })

      // The admin token names the organization; another organization's master key sees nothing.
      const listed = await t.admin(`/v1/webhooks?org_id=${t.orgId}`)
      expect(((await listed.json()) as { data: Created[] }).data.map((w) => w.id)).toContain(made.body.id)
      const other = (await (await t.admin('/v1/admin/organizations', { name: `other-${store}` })).json()) as {
        master_key: string
      }
      const foreign = await t.fetch(`/v1/webhooks/${made.body.id}`, { key: other.master_key })
      expect(foreign.status).toBe(404)
      expect(((await foreign.json()) as { error: { code: string } }).error.code).toBe('webhook_not_found')

      const deleted = await t.fetch(`/v1/webhooks/${made.body.id}`, { method: 'DELETE', key: t.masterKey })
      expect(await deleted.json()).toEqual({ id: made.body.id, object: 'webhook.deleted', deleted: true })
      expect((await t.fetch(`/v1/webhooks/${made.body.id}`, { key: t.masterKey })).status).toBe(404)
    } finally {
      r.stop()
    }
  })

  test("a key's limit at 80% and at 100%: one event each, signed, after real chat requests", async () => {
    const r = startReceiver()
    const hook = await createWebhook(t, { url: r.url, events: ['key.limit_80', 'key.limit_100'] })
    expect(hook.status).toBe(201)
    try {
      const key = await newApiKey(t, { name: 'limited', limit_rub: 0.02 })
      const answered = await spendUntilRefused(t.client(key.key))
      expect(answered).toBeGreaterThan(3)
      expect(await until(() => r.delivered().size >= 2)).toBe(true)
      // A few more refusals send nothing more.
      await spendUntilRefused(t.client(key.key))
      await t.svc.webhooks.settled()
      const events = (await (
        await t.fetch(`/v1/webhooks/${hook.body.id}/events`, { key: t.masterKey })
      ).json()) as { data: { id: string; status: string; type: string }[] }
      expect(events.data.map((e) => e.type).sort()).toEqual(['key.limit_100', 'key.limit_80'])
      expect(await until(() => events.data.every((e) => r.delivered().has(e.id)))).toBe(true)
      const byType = new Map([...r.delivered().values()].map((d) => [d.type, d]))
      expect(byType.get('key.limit_80')!.payload.data).toMatchObject({
        key_id: key.key_id,
        limit_rub: 0.02,
        threshold_percent: 80,
      })
      expect(byType.get('key.limit_80')!.payload.data.spent_rub as number).toBeGreaterThanOrEqual(0.016)
      expect(byType.get('key.limit_100')!.payload).toMatchObject({
        organization: t.orgId,
        data: { key_id: key.key_id, threshold_percent: 100 },
      })
      expect(new Set(r.deliveries.map((d) => d.eventId)).size).toBe(2)
      expectSigned(r, hook.body.secret)

      // Raising the limit arms both levels again, as new events.
      await t.fetch(`/v1/keys/${key.key_id}`, {
        method: 'PATCH',
        key: t.masterKey,
        body: JSON.stringify({ limit_rub: 0.03 }),
      })
      await spendUntilRefused(t.client(key.key))
      expect(await until(() => r.delivered().size >= 4)).toBe(true)
      expect(r.delivered().size).toBe(4)
    } finally {
      await t.fetch(`/v1/webhooks/${hook.body.id}`, { method: 'DELETE', key: t.masterKey })
      r.stop()
    }
  })

  test("a key's period budget at 80% and at 100%: one event each, with the period", async () => {
    const r = startReceiver()
    const hook = await createWebhook(t, { url: r.url, events: ['key.budget_80', 'key.budget_100'] })
    expect(hook.status).toBe(201)
    try {
      const key = await newApiKey(t, {
        name: 'budgeted',
        budget: { amount_rub: 0.02, period: 'day', timezone: 'Europe/Moscow' },
      })
      const answered = await spendUntilRefused(t.client(key.key))
      expect(answered).toBeGreaterThan(3)
      expect(await until(() => r.delivered().size >= 2)).toBe(true)
      await spendUntilRefused(t.client(key.key))
      await t.svc.webhooks.settled()
      const byType = new Map([...r.delivered().values()].map((d) => [d.type, d]))
      expect([...byType.keys()].sort()).toEqual(['key.budget_100', 'key.budget_80'])
      const listed = (await (await t.fetch(`/v1/keys/${key.key_id}`, { key: t.masterKey })).json()) as {
        budget: { period_start: number; resets_at: number }
      }
      for (const [type, pct] of [
        ['key.budget_80', 80],
        ['key.budget_100', 100],
      ] as const)
        expect(byType.get(type)!.payload.data).toMatchObject({
          key_id: key.key_id,
          budget_rub: 0.02,
          threshold_percent: pct,
          period: 'day',
          timezone: 'Europe/Moscow',
          period_start: listed.budget.period_start,
          resets_at: listed.budget.resets_at,
        })
      expect(byType.get('key.budget_80')!.payload.data.spent_rub as number).toBeGreaterThanOrEqual(0.016)
      expect(new Set(r.deliveries.map((d) => d.eventId)).size).toBe(2)
      expectSigned(r, hook.body.secret)
    } finally {
      await t.fetch(`/v1/webhooks/${hook.body.id}`, { method: 'DELETE', key: t.masterKey })
      r.stop()
    }
  })

  test('balance below a threshold: one event per drop; a credit above it arms it again', async () => {
    const r = startReceiver()
    const org = async () =>
      (await (await t.fetch('/v1/organization', { key: t.masterKey })).json()) as { balance_rub: number }
    const threshold = Math.round(((await org()).balance_rub - 0.01) * 1e6) / 1e6
    const hook = await createWebhook(t, {
      url: r.url,
      events: ['balance.below_threshold'],
      balance_threshold_rub: threshold,
    })
    expect(hook.status).toBe(201)
    const client = t.client()
    const spendBelow = async () => {
      for (let i = 0; i < 100 && (await org()).balance_rub >= threshold; i++)
        await client.chat.completions.create({
          model: 'test/chat',
          messages: [{ role: 'user', content: `balance ${i}` }],
          max_tokens: 40,
        })
      expect((await org()).balance_rub).toBeLessThan(threshold)
    }
    try {
      await spendBelow()
      expect(await until(() => r.delivered().size === 1)).toBe(true)
      // Still below: more requests send nothing more.
      for (let i = 0; i < 3; i++)
        await client.chat.completions.create({
          model: 'test/chat',
          messages: [{ role: 'user', content: 'x' }],
        })
      await t.svc.webhooks.settled()
      const first = [...r.delivered().values()][0]!
      expect(first.payload.data).toMatchObject({ threshold_rub: threshold })
      expect(first.payload.data.balance_rub as number).toBeLessThan(threshold)

      // A credit above the threshold, then a drop below it again: a second event, with its own id.
      expect((await t.admin(`/v1/admin/organizations/${t.orgId}/credit`, { amount_rub: 0.05 })).status).toBe(
        200,
      )
      await client.chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'up' }],
      })
      await spendBelow()
      expect(await until(() => r.delivered().size === 2)).toBe(true)
      await t.svc.webhooks.settled()
      const events = (await (
        await t.fetch(`/v1/webhooks/${hook.body.id}/events`, { key: t.masterKey })
      ).json()) as { data: unknown[] }
      expect(events.data.length).toBe(2)
      expectSigned(r, hook.body.secret)
    } finally {
      await t.fetch(`/v1/webhooks/${hook.body.id}`, { method: 'DELETE', key: t.masterKey })
      await t.admin(`/v1/admin/organizations/${t.orgId}/credit`, { amount_rub: 1 })
      r.stop()
    }
  })

  test('a batch completed, to a receiver that fails twice first: retried with the same id until delivered', async () => {
    const r = startReceiver({ failFirst: 2 })
    const hook = await createWebhook(t, { url: r.url, events: ['batch.completed', 'batch.failed'] })
    try {
      const batch = await startChatBatch(t.client(), 3)
      expect(await until(() => r.delivered().size === 1, 1500)).toBe(true)
      const d = [...r.delivered().values()][0]!
      expect(d.type).toBe('batch.completed')
      expect(d.payload.data).toMatchObject({
        batch_id: batch.id,
        status: 'completed',
        request_counts: { total: 3, completed: 3, failed: 0 },
      })
      expect(r.deliveries.map((x) => x.answered)).toEqual([500, 500, 200])
      expect(r.deliveries.map((x) => x.attempt)).toEqual([1, 2, 3])
      expect(new Set(r.deliveries.map((x) => x.eventId)).size).toBe(1)
      expect(new Set(r.deliveries.map((x) => x.body)).size).toBe(1)
      expectSigned(r, hook.body.secret)
      // The receiver answers 200 before the dispatcher records it: read until it has.
      let events: { data: Record<string, unknown>[] } = { data: [] }
      await until(async () => {
        events = (await (
          await t.fetch(`/v1/webhooks/${hook.body.id}/events`, { key: t.masterKey })
        ).json()) as typeof events
        return events.data[0]?.status === 'delivered'
      }, 250)
      expect(events.data[0]).toMatchObject({
        id: d.eventId,
        status: 'delivered',
        attempts: 3,
        last_status: 200,
      })
    } finally {
      await t.fetch(`/v1/webhooks/${hook.body.id}`, { method: 'DELETE', key: t.masterKey })
      r.stop()
    }
  })
})

test('an event no receiver takes is given up after give_up_after_sec, and stays listed as failed', async () => {
  const t = await startTropa({
    extra: { webhooks: { ...WEBHOOKS, give_up_after_sec: 1 } },
  })
  const r = startReceiver({ alwaysFail: true })
  try {
    const hook = await createWebhook(t, { url: r.url, events: ['key.limit_100'] })
    // A limit below any request's worst case: the first request is refused, and that is 100%.
    const key = await newApiKey(t, { name: 'tiny', limit_rub: 0.000001 })
    expect(await spendUntilRefused(t.client(key.key))).toBe(0)
    const list = async () =>
      (
        (await (await t.fetch(`/v1/webhooks/${hook.body.id}/events`, { key: t.masterKey })).json()) as {
          data: Record<string, unknown>[]
        }
      ).data
    expect(await until(async () => (await list())[0]?.status === 'failed')).toBe(true)
    const [e] = await list()
    expect(e).toMatchObject({ type: 'key.limit_100', last_status: 500, next_attempt_at: null })
    expect(e!.last_error).toContain('HTTP 500')
    expect(e!.payload).toMatchObject({ data: { key_id: key.key_id, reason: 'refused' } })
    expect(r.deliveries.length).toBeGreaterThan(1)
    const n = r.deliveries.length
    await Bun.sleep(300)
    expect(r.deliveries.length).toBe(n)
  } finally {
    r.stop()
    await t.stop()
  }
})
