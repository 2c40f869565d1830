import { afterAll, beforeAll, expect, test } from 'bun:test'
import Anthropic from '@anthropic-ai/sdk'
import OpenAI from 'openai'
import { startTropa, type Tropa } from '../helpers/start.ts'

// A key's max_concurrency on one node: requests in flight from admission until the answer (the
// whole stream) ended or the client left; past it 429 key_concurrency_exceeded, and the upstream
// is never called. The slot comes back on every way a request ends.
let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    // One slow node: a stream of n tokens lasts n x 20 ms (every answer runs to max_tokens).
    nodes: [{ name: 'slow', itlMs: 20, ignoreEos: true, seed: 1 }],
    upstream: { first_byte_timeout_ms: 1500, idle_timeout_ms: 1500 },
  })
})
afterAll(() => t.stop())

const messages = [{ role: 'user' as const, content: 'Count slowly.' }]

async function keyWith(body: Record<string, unknown>) {
  const res = await t.fetch('/v1/keys', {
    method: 'POST',
    key: t.masterKey,
    body: JSON.stringify({ name: 'concurrent', ...body }),
  })
  expect(res.status).toBe(201)
  return (await res.json()) as { key: string; key_id: string; max_concurrency: number | null }
}

/** A stream admitted and under way (its first chunk read); `rest` reads it to its end. */
async function openStream(c: OpenAI, maxTokens: number) {
  const abort = new AbortController()
  const stream = await c.chat.completions.create(
    { model: 'test/chat', messages, max_tokens: maxTokens, stream: true },
    { signal: abort.signal },
  )
  const it = stream[Symbol.asyncIterator]()
  expect((await it.next()).done).toBe(false)
  return {
    abort: () => abort.abort(),
    async rest() {
      let chunks = 0
      while (!(await it.next()).done) chunks++
      return chunks
    },
  }
}

const quick = (c: OpenAI) => c.chat.completions.create({ model: 'test/chat', messages, max_tokens: 1 })

/** The 429 a request gets, with its code and Retry-After. */
async function refused(p: Promise<unknown>) {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  )
  expect(err).toBeInstanceOf(OpenAI.RateLimitError)
  const e = err as InstanceType<typeof OpenAI.RateLimitError>
  return { code: e.code, retryAfter: e.headers?.get('retry-after') ?? null }
}

/** Sends quick requests until one is admitted (a client's abort reaches the server a moment later). */
async function admittedSoon(c: OpenAI) {
  for (let i = 0; i < 200; i++) {
    const r = await quick(c).then(
      () => 200,
      (e: unknown) => (e instanceof OpenAI.RateLimitError ? 429 : -1),
    )
    if (r === 200) return true
    expect(r).toBe(429)
    await Bun.sleep(25)
  }
  return false
}

test('max_concurrency = 2: the third request in flight gets 429 key_concurrency_exceeded and never reaches the upstream; a slot frees when a stream ends and when its client aborts', async () => {
  const k = await keyWith({ max_concurrency: 2 })
  expect(k.max_concurrency).toBe(2)
  const listed = (await (await t.fetch('/v1/keys', { key: t.masterKey })).json()) as {
    data: { key_id: string; max_concurrency: number | null }[]
  }
  expect(listed.data.find((x) => x.key_id === k.key_id)?.max_concurrency).toBe(2)
  const c = t.client(k.key)

  const short = await openStream(c, 40)
  const long = await openStream(c, 3000)
  const upstreamBefore = t.nodes[0]!.stats().chatRequests + t.nodes[0]!.stats().embeddingRequests
  const third = await refused(quick(c))
  expect(third).toEqual({ code: 'key_concurrency_exceeded', retryAfter: '1' })
  // Embeddings count too.
  expect((await refused(c.embeddings.create({ model: 'test/embed', input: 'x' }))).code).toBe(
    'key_concurrency_exceeded',
  )
  expect(t.nodes[0]!.stats().chatRequests + t.nodes[0]!.stats().embeddingRequests).toBe(upstreamBefore)

  // The short stream ends: its slot is free by the time its client has read the end.
  expect(await short.rest()).toBeGreaterThan(0)
  expect((await quick(c)).choices).toHaveLength(1)
  expect((await c.embeddings.create({ model: 'test/embed', input: 'x' })).data).toHaveLength(1)

  // Full again with a second long stream; then both clients leave mid-stream.
  const other = await openStream(c, 3000)
  expect((await refused(quick(c))).code).toBe('key_concurrency_exceeded')
  long.abort()
  other.abort()
  expect(await admittedSoon(c)).toBe(true)
  // Both slots came back: two streams in flight at once again.
  const a = await openStream(c, 3000)
  const b = await openStream(c, 3000)
  expect((await refused(quick(c))).code).toBe('key_concurrency_exceeded')
  a.abort()
  b.abort()
  expect(await admittedSoon(c)).toBe(true)
})

test('a slot comes back after an upstream failure, a stream cut mid-way and a first-byte timeout', async () => {
  const k = await keyWith({ max_concurrency: 1 })
  const c = t.client(k.key)
  const node = t.nodes[0]!
  try {
    node.setFaults({ errorRate: 1 })
    const failed = await quick(c).catch((e: unknown) => e)
    expect(failed).toBeInstanceOf(OpenAI.APIError)
    expect((failed as InstanceType<typeof OpenAI.APIError>).status).toBeGreaterThanOrEqual(500)
    node.setFaults({ errorRate: 0 })
    expect((await quick(c)).choices).toHaveLength(1)

    node.setFaults({ cutAfterTokens: 3 })
    const cut = await openStream(c, 50)
    await cut.rest().catch(() => {})
    node.setFaults({ cutAfterTokens: null })
    expect((await quick(c)).choices).toHaveLength(1)

    node.setFaults({ hang: true })
    const timedOut = await quick(c).catch((e: unknown) => e)
    expect((timedOut as InstanceType<typeof OpenAI.APIError>).status).toBeGreaterThanOrEqual(500)
    node.setFaults({ hang: false })
    expect((await quick(c)).choices).toHaveLength(1)
  } finally {
    node.setFaults({ errorRate: 0, cutAfterTokens: null, hang: false })
  }
})

test('a refused request frees nothing: with the one slot held, every other request is refused until it ends', async () => {
  const k = await keyWith({ max_concurrency: 1 })
  const c = t.client(k.key)
  const held = await openStream(c, 3000)
  const results = await Promise.all(Array.from({ length: 10 }, () => refused(quick(c))))
  expect(results.every((r) => r.code === 'key_concurrency_exceeded')).toBe(true)
  // The refusals released nothing they did not hold: the slot is still taken.
  expect((await refused(quick(c))).code).toBe('key_concurrency_exceeded')
  held.abort()
  expect(await admittedSoon(c)).toBe(true)
})

test('messages, responses and completions take slots too: with the one slot held, each gets 429; each frees its slot when it ends', async () => {
  const k = await keyWith({ max_concurrency: 1 })
  const c = t.client(k.key)
  const anthropic = new Anthropic({ baseURL: t.url, apiKey: k.key, maxRetries: 0, timeout: 20_000 })
  const message = () =>
    anthropic.messages.create({
      model: 'test/chat',
      max_tokens: 1,
      messages: [{ role: 'user', content: 'hi' }],
    })
  const response = () => c.responses.create({ model: 'test/chat', input: 'hi', max_output_tokens: 16 })
  const completion = () => c.completions.create({ model: 'test/chat', prompt: 'hi', max_tokens: 1 })

  const held = await openStream(c, 3000)
  expect((await refused(response())).code).toBe('key_concurrency_exceeded')
  expect((await refused(completion())).code).toBe('key_concurrency_exceeded')
  const err = await message().catch((e: unknown) => e)
  expect(err).toBeInstanceOf(Anthropic.RateLimitError)
  held.abort()
  expect(await admittedSoon(c)).toBe(true)
  // One after the other, each ends and frees its slot for the next.
  expect((await message()).content.length).toBeGreaterThan(0)
  // (the slow node writes until max_output_tokens: incomplete, but answered and billed)
  expect(['completed', 'incomplete']).toContain(String((await response()).status))
  expect((await completion()).choices).toHaveLength(1)
  expect((await quick(c)).choices).toHaveLength(1)
})

test('PATCH max_concurrency: null clears the bound, a number sets it; a dry run says when it would refuse', async () => {
  const k = await keyWith({ max_concurrency: 1 })
  const c = t.client(k.key)
  const held = await openStream(c, 3000)
  const quote = async () =>
    (await (
      await t.fetch('/v1/chat/completions', {
        method: 'POST',
        key: k.key,
        headers: { 'x-tropa-dry-run': '1' },
        body: JSON.stringify({ model: 'test/chat', messages, max_tokens: 1 }),
      })
    ).json()) as { admitted: boolean; refusal: { code: string } | null }
  expect(await quote()).toMatchObject({ admitted: false, refusal: { code: 'key_concurrency_exceeded' } })

  const patch = (v: number | null) =>
    t.fetch(`/v1/keys/${k.key_id}`, {
      method: 'PATCH',
      key: t.masterKey,
      body: JSON.stringify({ max_concurrency: v }),
    })
  const cleared = (await (await patch(null)).json()) as { max_concurrency: number | null }
  expect(cleared.max_concurrency).toBeNull()
  expect(await quote()).toMatchObject({ admitted: true, refusal: null })
  expect((await quick(c)).choices).toHaveLength(1)
  await patch(1)
  expect((await refused(quick(c))).code).toBe('key_concurrency_exceeded')
  held.abort()
  expect(await admittedSoon(c)).toBe(true)

  for (const bad of [0, -1, 1.5, 'two']) expect((await patch(bad as number)).status).toBe(400)
})
