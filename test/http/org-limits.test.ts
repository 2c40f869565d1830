import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type OpenAI from 'openai'
import { countChatPrompt, loadTokenizer } from '../../src/pipeline/tokens.ts'
import { startTropa, type Tropa } from '../helpers/start.ts'

// An organization's rpm_limit and tpm_limit over all its keys, and its per-model limits
// (model_limits), set by the admin; 429 org_rate_limited / model_rate_limited with Retry-After,
// checked after the key's own limits. On both stores: the limits are columns of the organization.
describe.each([['sqlite'], ['postgres']] as const)('%s', (storage) => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({ postgres: storage === 'postgres' })
  })
  afterAll(() => t.stop())

  const messages = [{ role: 'user' as const, content: 'Hello, organization.' }]

  /** Not within two seconds of a minute's end, so one test's requests fall in one window. */
  async function awayFromMinuteEnd() {
    const into = Date.now() % 60_000
    if (into > 58_000) await Bun.sleep(60_000 - into + 50)
  }

  let orgs = 0
  /** A new organization with these limits, its master key and two API keys. */
  async function orgWith(limits: Record<string, unknown>) {
    const res = await t.admin('/v1/admin/organizations', {
      name: `limited-${storage}-${++orgs}`,
      balance_rub: 100,
      ...limits,
    })
    expect(res.status).toBe(201)
    const org = (await res.json()) as { id: string; master_key: string } & Record<string, unknown>
    const key = async (extra: Record<string, unknown> = {}) => {
      const r = await t.fetch('/v1/keys', {
        method: 'POST',
        key: org.master_key,
        body: JSON.stringify({ name: 'k', ...extra }),
      })
      return t.client(((await r.json()) as { key: string }).key)
    }
    return { org, a: await key(), b: await key(), key }
  }

  const chat = (c: OpenAI) => c.chat.completions.create({ model: 'test/chat', messages, max_tokens: 3 })
  const embed = (c: OpenAI) => c.embeddings.create({ model: 'test/embed', input: 'vector' })

  /** Status and error code (with Retry-After) of each call, in order. */
  async function outcomes(calls: (() => Promise<unknown>)[]) {
    const out: { status: number; code?: string | null | undefined; retryAfter?: string | null }[] = []
    for (const call of calls) {
      const r = await call().then(
        () => ({ status: 200 }),
        (e: unknown) => {
          const err = e as InstanceType<typeof OpenAI.APIError>
          return {
            status: err.status ?? -1,
            code: err.code,
            retryAfter: err.headers?.get('retry-after') ?? null,
          }
        },
      )
      out.push(r)
    }
    return out
  }

  test('rpm_limit counts every key of the organization: the sixth request of two keys gets 429 org_rate_limited with Retry-After, and never reaches an upstream', async () => {
    const { org, a, b } = await orgWith({ rpm_limit: 5 })
    expect(org.rpm_limit).toBe(5)
    await awayFromMinuteEnd()
    const upstream = () => t.nodes.reduce((s, n) => s + n.stats().chatRequests, 0)
    const before = upstream()
    const res = await outcomes([a, b, a, b, a, b, a].map((c) => () => chat(c)))
    expect(res.slice(0, 5).every((r) => r.status === 200)).toBe(true)
    for (const r of res.slice(5)) {
      expect(r.status).toBe(429)
      expect(r.code).toBe('org_rate_limited')
      expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1)
      expect(Number(r.retryAfter)).toBeLessThanOrEqual(60)
    }
    expect(upstream() - before).toBe(5)
  })

  test("a key's own limit is checked first: its 429 is rate_limit_exceeded, and a request it refuses does not count for the organization", async () => {
    const { a, b, key } = await orgWith({ rpm_limit: 4 })
    const limitedKey = await key({ rpm_limit: 1 })
    await awayFromMinuteEnd()
    const res = await outcomes([limitedKey, limitedKey, limitedKey, a, b, a, b].map((c) => () => chat(c)))
    expect(res.map((r) => r.code ?? r.status)).toEqual([
      200,
      'rate_limit_exceeded',
      'rate_limit_exceeded',
      200,
      200,
      200,
      'org_rate_limited',
    ])
  })

  test('tpm_limit: the prompt tokens admitted over the minute stay within the organization limit', async () => {
    await loadTokenizer()
    const prompt = countChatPrompt(messages, undefined)
    const { a, b } = await orgWith({ tpm_limit: prompt * 4 + 1 })
    await awayFromMinuteEnd()
    const res = await outcomes(Array.from({ length: 8 }, (_, i) => () => chat(i % 2 ? a : b)))
    const ok = res.filter((r) => r.status === 200).length
    // Completion tokens count too (after each answer), so fewer than four may fit; never more.
    expect(ok).toBeGreaterThanOrEqual(1)
    expect(ok).toBeLessThanOrEqual(4)
    expect(res.slice(ok).every((r) => r.code === 'org_rate_limited')).toBe(true)
  })

  test('model_limits: a pattern limits each model it matches, an exact id wins over it, and each model counts on its own', async () => {
    const { org, a, b } = await orgWith({ model_limits: { 'test/*': { rpm: 3 }, 'test/embed': { rpm: 2 } } })
    expect(org.model_limits).toEqual({ 'test/*': { rpm: 3, tpm: null }, 'test/embed': { rpm: 2, tpm: null } })
    await awayFromMinuteEnd()
    const chats = await outcomes([a, b, a, b].map((c) => () => chat(c)))
    expect(chats.map((r) => r.code ?? r.status)).toEqual([200, 200, 200, 'model_rate_limited'])
    expect(chats[3]!.retryAfter).not.toBeNull()
    // test/embed is counted on its own, under its exact entry.
    const embeds = await outcomes([a, b, a].map((c) => () => embed(c)))
    expect(embeds.map((r) => r.code ?? r.status)).toEqual([200, 200, 'model_rate_limited'])
  })

  test("PATCH sets and clears the organization's limits (null clears one; model_limits is replaced whole); a dry run reports the refusal", async () => {
    const { org, a } = await orgWith({})
    const patch = (body: unknown) => t.admin(`/v1/admin/organizations/${org.id}`, body, 'PATCH')
    const set = (await (
      await patch({ rpm_limit: 2, model_limits: { 'test/chat': { tpm: 100000 } } })
    ).json()) as Record<string, unknown>
    expect(set).toMatchObject({ id: org.id, rpm_limit: 2, tpm_limit: null })
    expect(set.model_limits).toEqual({ 'test/chat': { rpm: null, tpm: 100000 } })
    expect(
      ((await (await t.admin(`/v1/admin/organizations/${org.id}`)).json()) as { rpm_limit: number })
        .rpm_limit,
    ).toBe(2)
    await awayFromMinuteEnd()
    expect((await outcomes([a, a, a].map((c) => () => chat(c)))).map((r) => r.code ?? r.status)).toEqual([
      200,
      200,
      'org_rate_limited',
    ])
    const quote = (await (
      await fetch(`${t.url}/v1/chat/completions`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${a.apiKey}`,
          'content-type': 'application/json',
          'x-tropa-dry-run': '1',
        },
        body: JSON.stringify({ model: 'test/chat', messages, max_tokens: 3 }),
      })
    ).json()) as { admitted: boolean; refusal: { code: string } | null }
    expect(quote).toMatchObject({ admitted: false, refusal: { code: 'org_rate_limited' } })

    const cleared = (await (await patch({ rpm_limit: null, model_limits: null })).json()) as Record<
      string,
      unknown
    >
    expect(cleared).toMatchObject({ rpm_limit: null, tpm_limit: null, model_limits: null })
    expect((await outcomes([() => chat(a)]))[0]!.status).toBe(200)
  })

  test('bad limits are refused with 400 and change nothing', async () => {
    const { org } = await orgWith({ rpm_limit: 7 })
    const patch = (body: unknown) => t.admin(`/v1/admin/organizations/${org.id}`, body, 'PATCH')
    for (const bad of [
      { rpm_limit: 0 },
      { tpm_limit: 1.5 },
      { model_limits: { 'bad model': { rpm: 1 } } },
      { model_limits: { 'test/chat': { rpm: 1, burst: 2 } } },
      { model_limits: { 'test/chat': { rpm: -1 } } },
      { model_limits: ['test/chat'] },
      { unknown: 1 },
    ])
      expect((await patch(bad)).status).toBe(400)
    expect((await patch({ rpm_limit: 7 })).status).toBe(200)
    expect((await t.admin('/v1/admin/organizations/org_missing', { rpm_limit: 1 }, 'PATCH')).status).toBe(404)
    // An API or master key cannot set them.
    const res = await fetch(`${t.url}/v1/admin/organizations/${org.id}`, {
      method: 'PATCH',
      headers: { authorization: `Bearer ${org.master_key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ rpm_limit: 1000 }),
    })
    expect(res.status).toBe(403)
  })
})
