import { afterEach, describe, expect, test } from 'bun:test'
import type OpenAI from 'openai'
import type { APIError } from 'openai'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { SimNode, SimNodeOptions } from '../../src/simulator/index.ts'
import { usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// Images on a gigachat route: openai SDK -> Tropa -> the simulated GigaChat, whose storage takes
// the image (POST /files) before the chat names it in `attachments`.

const KEY = btoa('tropa-client:tropa-secret')
const PRICE = {
  promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
  completionNano: parseRub(CHAT_PRICE.completion, 6)!,
}
const MODEL = 'gigachat/gigachat-sim'
/** The simulated node's prompt tokens for one image (src/simulator/render.ts). */
const IMAGE_TOKENS = 85

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const origin = (n: SimNode) => new URL(n.url).origin
const models = (nodes: SimNode[]): ModelFile[] => [
  {
    id: MODEL,
    kind: 'chat',
    context_length: 8192,
    pricing: CHAT_PRICE,
    routes: nodes.map((n, i) => ({
      name: n.name,
      provider: 'gigachat' as const,
      base_url: `${origin(n)}/api/v1`,
      auth_url: `${origin(n)}/api/v2/oauth`,
      api_key_env: 'GIGACHAT_KEY',
      upstream_model: 'GigaChat',
      // The first node is the router's first choice.
      weight: i === 0 ? 1000 : 1,
    })),
  },
]
const giga = (name: string, extra: Partial<SimNodeOptions> = {}): SimNodeOptions => ({
  name,
  protocol: 'gigachat',
  timeScale: 0,
  seed: 1,
  ...extra,
})
const start = (nodes: SimNodeOptions[]) => startTropa({ nodes, models, env: { GIGACHAT_KEY: KEY } })

// A 1x1 PNG, and another image (different bytes).
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=='
const BMP = Buffer.from(`BM${'x'.repeat(64)}`).toString('base64')
const QUESTION = 'Что на картинке?'
const withImage = (url: string): OpenAI.ChatCompletionMessageParam[] => [
  {
    role: 'user',
    content: [
      { type: 'text', text: QUESTION },
      { type: 'image_url', image_url: { url } },
    ],
  },
]
const stats = (tropa: Tropa) =>
  tropa.nodes.reduce(
    (s, n) => {
      const x = n.stats()
      return {
        prompt: s.prompt + x.promptTokens,
        completion: s.completion + x.completionTokens,
        auth: s.auth + x.authRequests,
        uploads: s.uploads + x.uploads,
        chats: s.chats + x.chatRequests,
      }
    },
    { prompt: 0, completion: 0, auth: 0, uploads: 0, chats: 0 },
  )

/** A token of the node's own, to work its storage directly. */
async function nodeToken(n: SimNode): Promise<string> {
  const r = await fetch(`${origin(n)}/api/v2/oauth`, {
    method: 'POST',
    headers: { authorization: `Basic ${KEY}`, rquid: crypto.randomUUID() },
    body: 'scope=GIGACHAT_API_PERS',
  })
  return ((await r.json()) as { access_token: string }).access_token
}

describe('images on a gigachat route', () => {
  test('a data-URL image is uploaded once, attached, counted in the prompt and billed exactly; sent again it is not uploaded again', async () => {
    t = await start([giga('giga-1')])
    const client = t.client()
    // The same question without the image, for the node's count of the image.
    const plain = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: QUESTION }],
      max_tokens: 8,
    })
    const before = stats(t)
    const { data, response } = await client.chat.completions
      .create({ model: MODEL, messages: withImage(`data:image/png;base64,${PNG}`), max_tokens: 8 })
      .withResponse()
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0)
    const after = stats(t)
    expect(after.uploads).toBe(1)
    expect(data.usage!.prompt_tokens).toBe(plain.usage!.prompt_tokens + IMAGE_TOKENS)
    expect(data.usage!.prompt_tokens).toBe(after.prompt - before.prompt)
    const expected = costNano(data.usage!.prompt_tokens, data.usage!.completion_tokens, PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
    const rows = await usageRows(t)
    expect(rows).toHaveLength(2)
    expect(rows.find((r) => r.costNano === expected)).toMatchObject({ estimated: false, outcome: 'ok' })

    // The next turn of the conversation carries the image again: no second upload.
    const next = await client.chat.completions.create({
      model: MODEL,
      messages: [
        ...withImage(`data:image/png;base64,${PNG}`),
        { role: 'assistant', content: data.choices[0]!.message.content },
        { role: 'user', content: 'А подробнее?' },
      ],
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    })
    let usage: OpenAI.CompletionUsage | undefined
    for await (const c of next) if (c.usage) usage = c.usage
    expect(stats(t).uploads).toBe(1)
    expect(usage!.prompt_tokens).toBeGreaterThan(data.usage!.prompt_tokens)
    // Another image is another upload; jpeg/png/tiff/bmp are GigaChat's types.
    await client.chat.completions.create({
      model: MODEL,
      messages: withImage(`data:image/bmp;base64,${BMP}`),
      max_tokens: 4,
    })
    expect(stats(t).uploads).toBe(2)
    expect(t.svc.deps.pool.nodes.size).toBe(1)
  }, 30_000)

  test('the same image twice in one request is uploaded once', async () => {
    t = await start([giga('giga-1')])
    const image = `data:image/png;base64,${PNG}`
    await t.client().chat.completions.create({
      model: MODEL,
      messages: [...withImage(image), { role: 'assistant', content: 'Точка.' }, ...withImage(image)],
      max_tokens: 4,
    })
    expect(stats(t).uploads).toBe(1)
  })

  test('refused with a 400 naming the param, before any upstream call: a URL image, an oversized one, a GIF, two in one message', async () => {
    t = await start([giga('giga-1')])
    const client = t.client()
    const refused = async (messages: OpenAI.ChatCompletionMessageParam[]) =>
      (await client.chat.completions
        .create({ model: MODEL, messages, max_tokens: 4 })
        .catch((e: unknown) => e)) as APIError
    const url = await refused(withImage('https://example.com/cat.png'))
    expect(url.status).toBe(400)
    expect(url.message).toContain('data URL')
    expect((url.error as { param?: string }).param).toBe('messages[0].content[1].image_url.url')

    // 15 MiB and one byte, decoded.
    const big = Buffer.alloc(15 * 1024 * 1024 + 1, 7).toString('base64')
    const oversized = await refused(withImage(`data:image/png;base64,${big}`))
    expect(oversized.status).toBe(400)
    expect(oversized.message).toContain('15728640')
    expect((oversized.error as { param?: string }).param).toBe('messages[0].content[1].image_url.url')

    const gif = await refused(withImage(`data:image/gif;base64,${PNG}`))
    expect(gif.status).toBe(400)
    expect(gif.message).toContain('image/gif')

    const two = await refused([
      {
        role: 'user',
        content: [
          { type: 'image_url', image_url: { url: `data:image/png;base64,${PNG}` } },
          { type: 'image_url', image_url: { url: `data:image/bmp;base64,${BMP}` } },
        ],
      },
    ])
    expect(two.status).toBe(400)
    expect((two.error as { param?: string }).param).toBe('messages[0].content[1]')

    const bad = await refused(withImage('data:image/png;base64,not*base64'))
    expect(bad.status).toBe(400)

    expect(stats(t)).toMatchObject({ uploads: 0, chats: 0 })
    expect(await usageRows(t)).toHaveLength(0)
  }, 30_000)

  test('a token refused during the upload is refreshed once and the upload retried', async () => {
    t = await start([giga('giga-1')])
    const client = t.client()
    await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: QUESTION }],
      max_tokens: 2,
    })
    expect(stats(t).auth).toBe(1)
    expect((await fetch(`${origin(t.nodes[0]!)}/sim/revoke-tokens`, { method: 'POST' })).status).toBe(204)
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: withImage(`data:image/png;base64,${PNG}`),
      max_tokens: 4,
    })
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(stats(t)).toMatchObject({ auth: 2, uploads: 1 })
    expect(await usageRows(t)).toHaveLength(2)
  })

  test('a remembered file gone from the storage is uploaded anew and the chat sent once more', async () => {
    t = await start([giga('giga-1')])
    const client = t.client()
    const image = `data:image/png;base64,${PNG}`
    await client.chat.completions.create({ model: MODEL, messages: withImage(image), max_tokens: 2 })
    // Someone empties the account's storage.
    const node = t.nodes[0]!
    const auth = { authorization: `Bearer ${await nodeToken(node)}` }
    const list = (await (await fetch(`${origin(node)}/api/v1/files`, { headers: auth })).json()) as {
      data: { id: string }[]
    }
    expect(list.data).toHaveLength(1)
    for (const f of list.data)
      expect(
        (await fetch(`${origin(node)}/api/v1/files/${f.id}/delete`, { method: 'POST', headers: auth })).ok,
      ).toBe(true)
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: withImage(image),
      max_tokens: 2,
    })
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(stats(t).uploads).toBe(2)
    // Billed once per request: the refused first try cost nothing.
    expect(await usageRows(t)).toHaveLength(2)
  })

  test('a node failing the upload (503) fails the request over to the other node, billed once', async () => {
    t = await start([giga('giga-down', { faults: { rate503: 1 } }), giga('giga-2', { seed: 2 })])
    const { data, response } = await t
      .client()
      .chat.completions.create({
        model: MODEL,
        messages: withImage(`data:image/png;base64,${PNG}`),
        max_tokens: 4,
      })
      .withResponse()
    expect(response.headers.get('x-tropa-node')).toBe('giga-2')
    const [down, up] = t.nodes
    expect(down!.stats().uploads).toBe(0)
    expect(up!.stats().uploads).toBe(1)
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]!.costNano).toBe(costNano(data.usage!.prompt_tokens, data.usage!.completion_tokens, PRICE))
  })
})

describe('a hostile storage', () => {
  test('an upload answered without a file id (or with garbage) is the node failing: the request fails over', async () => {
    let uploads = 0
    const fake = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      fetch: (req) => {
        const path = new URL(req.url).pathname
        if (path === '/api/v2/oauth')
          return Response.json({ access_token: 'tok', expires_at: Date.now() + 3_600_000 })
        if (path === '/api/v1/files') {
          uploads++
          return new Response(uploads % 2 ? '{"object":"file"}' : 'x'.repeat(200_000), {
            headers: { 'content-type': 'application/json' },
          })
        }
        return new Response('no', { status: 500 })
      },
    })
    try {
      t = await startTropa({
        nodes: [giga('giga-2', { seed: 2 })],
        models: (nodes) => {
          const [m] = models(nodes)
          const fakeRoute = {
            ...m!.routes![0]!,
            name: 'giga-fake',
            base_url: `http://127.0.0.1:${fake.port}/api/v1`,
            auth_url: `http://127.0.0.1:${fake.port}/api/v2/oauth`,
            weight: 1000,
          }
          return [{ ...m!, routes: [fakeRoute, { ...m!.routes![0]!, weight: 1 }] }]
        },
        env: { GIGACHAT_KEY: KEY },
      })
      for (let i = 0; i < 2; i++) {
        const { response } = await t
          .client()
          .chat.completions.create({
            model: MODEL,
            messages: withImage(`data:image/png;base64,${PNG}`),
            max_tokens: 2,
          })
          .withResponse()
        expect(response.headers.get('x-tropa-node')).toBe('giga-2')
      }
      expect(uploads).toBeGreaterThan(0)
      expect(await usageRows(t)).toHaveLength(2)
    } finally {
      fake.stop(true)
    }
  })

  test('an upload the storage refuses (422) is the client 400 with its message, as a refused chat is; no failover', async () => {
    const fake = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      fetch: (req) => {
        const path = new URL(req.url).pathname
        if (path === '/api/v2/oauth')
          return Response.json({ access_token: 'tok', expires_at: Date.now() + 3_600_000 })
        if (path === '/api/v1/files')
          return Response.json({ status: 422, message: 'the image cannot be read' }, { status: 422 })
        return new Response('no', { status: 500 })
      },
    })
    try {
      t = await startTropa({
        nodes: [giga('giga-2', { seed: 2 })],
        models: (nodes) => {
          const [m] = models(nodes)
          const fakeRoute = {
            ...m!.routes![0]!,
            name: 'giga-fake',
            base_url: `http://127.0.0.1:${fake.port}/api/v1`,
            auth_url: `http://127.0.0.1:${fake.port}/api/v2/oauth`,
            weight: 1000,
          }
          return [{ ...m!, routes: [fakeRoute, { ...m!.routes![0]!, weight: 1 }] }]
        },
        env: { GIGACHAT_KEY: KEY },
      })
      const err = (await t
        .client()
        .chat.completions.create({
          model: MODEL,
          messages: withImage(`data:image/png;base64,${PNG}`),
          max_tokens: 2,
        })
        .catch((e: unknown) => e)) as APIError
      expect(err.status).toBe(400)
      expect(err.message).toContain('the image cannot be read')
      expect(t.nodes[0]!.stats()).toMatchObject({ uploads: 0, chatRequests: 0 })
      expect(await usageRows(t)).toHaveLength(0)
    } finally {
      fake.stop(true)
    }
  })
})
