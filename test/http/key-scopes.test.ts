import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI, { toFile } from 'openai'
import { startTropa, type Tropa } from '../helpers/start.ts'

// A key's `expires_at` (401 key_expired afterwards, listed as expired) and `models` (403
// model_not_allowed on any other model; the catalogue it sees lists only its models; its
// batches' lines are checked too).
let t: Tropa
beforeAll(async () => {
  t = await startTropa()
})
afterAll(() => t.stop())

const keys = (path = '', body?: unknown, method = body === undefined ? 'GET' : 'POST') =>
  fetch(`${t.url}/v1/keys${path}`, {
    method,
    headers: { authorization: `Bearer ${t.masterKey}`, 'content-type': 'application/json' },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  })
async function newKey(body: Record<string, unknown>) {
  const res = await keys('', { name: 'scoped', ...body })
  expect(res.status).toBe(201)
  return (await res.json()) as {
    key: string
    key_id: string
    status: string
    expires_at: number | null
    models: string[] | null
  }
}
const client = (key: string) => new OpenAI({ baseURL: t.baseURL, apiKey: key, maxRetries: 0 })
const chat = (c: OpenAI, model = 'test/chat') =>
  c.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 })
const now = () => Math.floor(Date.now() / 1000)

describe('expires_at', () => {
  test('a key works until expires_at, then gets 401 key_expired and is listed as expired; clearing it brings it back', async () => {
    const k = await newKey({ expires_at: now() + 3600 })
    expect(k.expires_at).toBe(now() + 3600)
    expect((await chat(client(k.key))).choices).toHaveLength(1)

    const patched = await keys(`/${k.key_id}`, { expires_at: now() - 1 }, 'PATCH')
    expect(((await patched.json()) as { status: string }).status).toBe('expired')
    const err = await chat(client(k.key)).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError)
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe('key_expired')
    const listed = ((await (await keys()).json()) as { data: { key_id: string; status: string }[] }).data
    expect(listed.find((x) => x.key_id === k.key_id)?.status).toBe('expired')

    await keys(`/${k.key_id}`, { expires_at: null }, 'PATCH')
    expect((await chat(client(k.key))).choices).toHaveLength(1)
  })

  test('expires_at must be Unix seconds or null', async () => {
    for (const bad of [-1, 1.5, 'tomorrow'])
      expect((await keys('', { name: 'x', expires_at: bad })).status).toBe(400)
  })
})

describe('models', () => {
  test('a key limited to one model: that model works, another gets 403 model_not_allowed, and its catalogue lists only its own', async () => {
    const k = await newKey({ models: ['test/chat'] })
    expect(k.models).toEqual(['test/chat'])
    const c = client(k.key)
    expect((await chat(c)).choices).toHaveLength(1)
    const err = await c.embeddings.create({ model: 'test/embed', input: 'x' }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.PermissionDeniedError)
    expect((err as InstanceType<typeof OpenAI.PermissionDeniedError>).code).toBe('model_not_allowed')
    expect((await c.models.list()).data.map((m) => m.id)).toEqual(['test/chat'])
    const one = await c.models.retrieve('test/embed').catch((e: unknown) => e)
    expect(one).toBeInstanceOf(OpenAI.PermissionDeniedError)
    // An unknown model is still 404, not 403.
    expect(await chat(c, 'test/nothing').catch((e: unknown) => e)).toBeInstanceOf(OpenAI.NotFoundError)
  })

  test('patterns: test/* reaches both models; an empty list reaches none; null lifts the limit', async () => {
    const k = await newKey({ models: ['test/*'] })
    const c = client(k.key)
    expect((await chat(c)).choices).toHaveLength(1)
    expect((await c.embeddings.create({ model: 'test/embed', input: 'x' })).data).toHaveLength(1)
    await keys(`/${k.key_id}`, { models: [] }, 'PATCH')
    expect(await chat(c).catch((e: unknown) => e)).toBeInstanceOf(OpenAI.PermissionDeniedError)
    expect((await c.models.list()).data).toEqual([])
    await keys(`/${k.key_id}`, { models: null }, 'PATCH')
    expect((await chat(c)).choices).toHaveLength(1)
    expect((await c.models.list()).data.length).toBeGreaterThanOrEqual(2)
  })

  test("a batch's lines are checked against its key's models: a line for another model fails validation", async () => {
    const k = await newKey({ models: ['test/embed'] })
    const c = client(k.key)
    const file = await c.files.create({
      file: await toFile(
        Buffer.from(
          `${JSON.stringify({ custom_id: 'a', method: 'POST', url: '/v1/chat/completions', body: { model: 'test/chat', messages: [{ role: 'user', content: 'x' }], max_tokens: 5 } })}\n`,
        ),
        'b.jsonl',
      ),
      purpose: 'batch',
    })
    let b = await c.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    })
    for (let i = 0; i < 300 && b.status === 'validating'; i++) {
      await Bun.sleep(20)
      b = await c.batches.retrieve(b.id)
    }
    expect(b.status).toBe('failed')
    expect(b.errors?.data?.[0]).toMatchObject({ code: 'model_not_allowed', line: 1, param: 'body.model' })
  })

  test('models must be a list of ids or patterns', async () => {
    for (const bad of ['test/chat', [''], ['has space'], [1]])
      expect((await keys('', { name: 'x', models: bad })).status).toBe(400)
  })
})
