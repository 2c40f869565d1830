import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { periodAt } from '../../src/billing/budgets.ts'
import { costNano, nanoToRubNumber, parseRub, rubNumberToNano } from '../../src/billing/money.ts'
import { countChatPrompt, loadTokenizer, reservedPromptTokens } from '../../src/pipeline/tokens.ts'
import { usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

// Period budgets (a key's `budget`) and end-user budgets (`end_user_budget`) over real HTTP with
// the openai SDK, on SQLite and PostgreSQL. The router's budget clock is moved by the test, so a
// period boundary is crossed without waiting for one.

const messages = [{ role: 'user' as const, content: 'Say something short.' }]
const MAX = 8
const TZ = 'Europe/Moscow'

describe.each([
  ['sqlite', false],
  ['postgres', true],
])('budgets on %s', (_, postgres) => {
  let t: Tropa
  let offsetMs = 0
  const clock = () => Date.now() + offsetMs
  let worst: bigint
  beforeAll(async () => {
    await loadTokenizer()
    t = await startTropa({ postgres, clock })
    const price = {
      promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
      completionNano: parseRub(CHAT_PRICE.completion, 6)!,
    }
    worst = costNano(reservedPromptTokens(countChatPrompt(messages, undefined)), MAX, price)
  })
  afterAll(() => t.stop())

  const keys = (path = '', body?: unknown, method = body === undefined ? 'GET' : 'POST') =>
    t.fetch(`/v1/keys${path}`, {
      method,
      key: t.masterKey,
      ...(body !== undefined && { body: JSON.stringify(body) }),
    })
  const chat = (c: OpenAI, user?: string, headers?: Record<string, string>) =>
    c.chat.completions.create(
      { model: 'test/chat', messages, max_tokens: MAX, ...(user !== undefined && { user }) },
      headers ? { headers } : undefined,
    )
  const refusal = async (p: Promise<unknown>) => {
    const err = await p.then(
      () => undefined,
      (e: unknown) => e,
    )
    expect(err).toBeInstanceOf(OpenAI.APIError)
    const e = err as InstanceType<typeof OpenAI.APIError>
    expect(e.status).toBe(402)
    return { code: e.code, resetsAt: Number(e.headers?.get('x-tropa-budget-resets-at')) }
  }

  test('a key budget refuses with 402 key_budget_exhausted and the reset time; GET /v1/keys shows the period; at the boundary it resets', async () => {
    offsetMs = 0
    const amount = worst * 3n
    const k = await newApiKey(t, {
      name: 'budgeted',
      budget: { amount_rub: nanoToRubNumber(amount), period: 'day', timezone: TZ },
    })
    const c = t.client(k.key)
    const day = periodAt('day', TZ, clock())
    let ok = 0
    let refused: { code: string | null | undefined; resetsAt: number } | undefined
    for (let i = 0; i < 10 && !refused; i++) {
      try {
        await chat(c)
        ok++
      } catch {
        refused = await refusal(chat(c))
      }
    }
    expect(ok).toBeGreaterThanOrEqual(3)
    expect(refused).toEqual({ code: 'key_budget_exhausted', resetsAt: day.endMs / 1000 })

    const rows = (await usageRows(t)).filter((r) => r.keyId === k.key_id)
    expect(rows).toHaveLength(ok)
    const spent = rows.reduce((s, r) => s + r.costNano, 0n)
    expect(spent).toBeLessThanOrEqual(amount)
    for (const r of rows) {
      expect(r.admittedAtMs).toBeGreaterThanOrEqual(day.startMs)
      expect(r.admittedAtMs).toBeLessThan(day.endMs)
    }
    const view = (await (await keys(`/${k.key_id}`)).json()) as {
      budget: {
        amount_rub: number
        period: string
        timezone: string
        spent_rub: number
        resets_at: number
        period_start: number
      }
    }
    expect(view.budget).toEqual({
      amount_rub: nanoToRubNumber(amount),
      period: 'day',
      timezone: TZ,
      spent_rub: nanoToRubNumber(spent),
      reserved_rub: 0,
      period_start: day.startMs / 1000,
      resets_at: day.endMs / 1000,
    } as typeof view.budget)
    const listed = (await (await keys()).json()) as {
      data: { key_id: string; budget: { spent_rub: number } | null }[]
    }
    expect(listed.data.find((x) => x.key_id === k.key_id)?.budget?.spent_rub).toBe(nanoToRubNumber(spent))

    // A quote says the same, without charging.
    const quote = (await (
      await t.fetch('/v1/chat/completions', {
        method: 'POST',
        key: k.key,
        headers: { 'x-tropa-dry-run': '1' },
        body: JSON.stringify({ model: 'test/chat', messages, max_tokens: MAX }),
      })
    ).json()) as { admitted: boolean; refusal: { code: string; resets_at: number } }
    expect(quote.admitted).toBe(false)
    expect(quote.refusal).toMatchObject({ code: 'key_budget_exhausted', resets_at: day.endMs / 1000 })

    // One second past Moscow midnight: a new day, the budget from zero.
    offsetMs = day.endMs + 1000 - Date.now()
    await chat(c)
    const next = (await (await keys(`/${k.key_id}`)).json()) as typeof view
    const after = (await usageRows(t)).filter((r) => r.keyId === k.key_id && r.admittedAtMs! >= day.endMs)
    expect(after).toHaveLength(1)
    expect(next.budget.spent_rub).toBe(nanoToRubNumber(after[0]!.costNano))
    expect(next.budget.period_start).toBe(day.endMs / 1000)
    expect(next.budget.resets_at).toBe(day.endMs / 1000 + 86_400)
    // The lifetime limit still applies beside it: the key's spend covers both days.
    const patched = await keys(
      `/${k.key_id}`,
      { limit_rub: nanoToRubNumber(spent + after[0]!.costNano) },
      'PATCH',
    )
    expect(patched.status).toBe(200)
    expect((await refusal(chat(c))).code).toBe('key_limit_reached')
    // Cleared with null: only the limit is left.
    const cleared = (await (
      await keys(`/${k.key_id}`, { budget: null, limit_rub: null }, 'PATCH')
    ).json()) as {
      budget: unknown
    }
    expect(cleared.budget).toBeNull()
    await chat(c)
    offsetMs = 0
  })

  test('an end-user budget limits each end user apart, named by `user` or by x-tropa-end-user (the header wins)', async () => {
    offsetMs = 0
    const amount = worst * 2n
    const k = await newApiKey(t, {
      name: 'per-user',
      end_user_budget: { amount_rub: nanoToRubNumber(amount), period: 'month', timezone: TZ },
    })
    const c = t.client(k.key)
    const month = periodAt('month', TZ, clock())
    /** Requests for one end user until the budget refuses one; how many were answered. */
    const untilRefused = async (user: string | undefined, headers?: Record<string, string>) => {
      let ok = 0
      for (;;) {
        const err = await chat(c, user, headers).then(
          () => undefined,
          (e: unknown) => e,
        )
        if (err === undefined) {
          ok++
          expect(ok).toBeLessThan(20)
          continue
        }
        const e = err as InstanceType<typeof OpenAI.APIError>
        expect(e.status).toBe(402)
        return { ok, code: e.code, resetsAt: Number(e.headers?.get('x-tropa-budget-resets-at')) }
      }
    }
    const alice = await untilRefused('alice')
    expect(alice.ok).toBeGreaterThanOrEqual(2)
    expect(alice).toMatchObject({ code: 'end_user_budget_exhausted', resetsAt: month.endMs / 1000 })
    // Bob is another end user: the header names him, and wins over the body's alice.
    const bob = await untilRefused('alice', { 'x-tropa-end-user': 'bob' })
    expect(bob.ok).toBe(alice.ok)
    expect((await refusal(chat(c, undefined, { 'x-tropa-end-user': 'bob' }))).code).toBe(
      'end_user_budget_exhausted',
    )
    // A request that names no end user is limited by the key's own limits only.
    await chat(c)
    // Embeddings name end users too.
    await c.embeddings.create({ model: 'test/embed', input: 'x', user: 'carol' })

    const rows = (await usageRows(t)).filter((x) => x.keyId === k.key_id)
    const by = (u: string | null) => rows.filter((x) => (x.endUser ?? null) === u)
    expect(by('alice')).toHaveLength(alice.ok)
    expect(by('bob')).toHaveLength(bob.ok)
    expect(by(null)).toHaveLength(1)
    expect(by('carol')).toHaveLength(1)
    for (const u of ['alice', 'bob'])
      expect(by(u).reduce((s, x) => s + x.costNano, 0n)).toBeLessThanOrEqual(amount)

    // Activity filters by end user, and exports carry it.
    const activity = (await (
      await t.fetch(`/v1/activity?key_id=${k.key_id}&end_user=alice`, { key: t.masterKey })
    ).json()) as {
      data: { end_user: string | null; key_id: string }[]
    }
    expect(activity.data).toHaveLength(alice.ok)
    expect(activity.data.every((x) => x.end_user === 'alice')).toBe(true)
    const csv = await (
      await t.fetch(`/v1/activity?key_id=${k.key_id}&format=csv`, { key: t.masterKey })
    ).text()
    const [head, ...lines] = csv.trim().split('\r\n')
    const col = head!.split(',').indexOf('end_user')
    expect(col).toBeGreaterThan(0)
    expect(lines.map((l) => l.split(',')[col]).sort()).toEqual(
      ['', ...Array(alice.ok).fill('alice'), ...Array(bob.ok).fill('bob'), 'carol'].sort(),
    )
    const jsonl = await (await t.fetch(`/v1/activity?end_user=bob&format=jsonl`, { key: t.masterKey })).text()
    expect(
      jsonl
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { end_user: string }).end_user),
    ).toEqual(Array(bob.ok).fill('bob'))

    // Usage groups by end user and filters by one.
    const usage = (await (await t.fetch('/v1/usage?group_by=end_user', { key: t.masterKey })).json()) as {
      data: { key_id: string; model: string; end_user: string | null; requests: number; cost_rub: number }[]
    }
    const mine = usage.data.filter((x) => x.key_id === k.key_id && x.model === 'test/chat')
    expect(Object.fromEntries(mine.map((x) => [String(x.end_user), x.requests]))).toEqual({
      alice: alice.ok,
      bob: bob.ok,
      null: 1,
    })
    const aliceUsage = (await (await t.fetch('/v1/usage?end_user=alice', { key: t.masterKey })).json()) as {
      data: { requests: number; cost_rub: number }[]
    }
    expect(aliceUsage.data.reduce((s, x) => s + x.requests, 0)).toBe(alice.ok)
    expect(rubNumberToNano(aliceUsage.data.reduce((s, x) => s + x.cost_rub, 0))).toBe(
      by('alice').reduce((s, x) => s + x.costNano, 0n),
    )
  })

  test('budgets are checked when set: zone, period, amount; end user ids are bounded', async () => {
    const bad = [
      { budget: { amount_rub: 1, period: 'day', timezone: 'Mars/Olympus' } },
      { budget: { amount_rub: 1, period: 'year' } },
      { budget: { amount_rub: -1, period: 'day' } },
      { budget: { amount_rub: 0.0000001, period: 'day' } },
      { end_user_budget: { amount_rub: 1, period: 'week', extra: 1 } },
    ]
    for (const b of bad) expect((await keys('', { name: 'x', ...b })).status).toBe(400)
    const k = await newApiKey(t, { name: 'utc', budget: { amount_rub: 1, period: 'week' } })
    const view = (await (await keys(`/${k.key_id}`)).json()) as {
      budget: { timezone: string; resets_at: number }
    }
    expect(view.budget.timezone).toBe('UTC')
    expect(view.budget.resets_at).toBe(periodAt('week', 'UTC', clock()).endMs / 1000)
    const long = 'u'.repeat(257)
    const err = await chat(t.client(k.key), long).catch((e: unknown) => e)
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(400)
    const viaHeader = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      key: k.key,
      headers: { 'x-tropa-end-user': long },
      body: JSON.stringify({ model: 'test/chat', messages, max_tokens: MAX }),
    })
    expect(viaHeader.status).toBe(400)
    expect(((await viaHeader.json()) as { error: { param: string } }).error.param).toBe('x-tropa-end-user')
    await chat(t.client(k.key), 'u'.repeat(256))
  })
})
