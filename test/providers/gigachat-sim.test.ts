import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { GigaChat } from 'gigachat'
import { type SimNode, startSimNode } from '../../src/simulator/index.ts'

// The simulated GigaChat front, checked with Sber's official client (npm `gigachat` 0.0.20): what
// it sends is what the fake must accept, what the fake answers is what the client must read.

const CREDENTIALS = btoa('sim-client-id:sim-client-secret')
let node: SimNode
beforeAll(async () => {
  node = await startSimNode({
    name: 'giga',
    protocol: 'gigachat',
    timeScale: 0,
    seed: 1,
    tokenLifetimeMs: 400,
  })
})
afterAll(() => node.stop())

const client = (credentials = CREDENTIALS) =>
  new GigaChat({
    credentials,
    baseUrl: `http://127.0.0.1:${node.port}/api/v1`,
    authUrl: `http://127.0.0.1:${node.port}/api/v2/oauth`,
    scope: 'GIGACHAT_API_PERS',
    timeout: 10,
  })

describe('the GigaChat fake through the official gigachat client', () => {
  test('OAuth with the Basic key and RqUID, then chat with the Bearer token: text, finish, usage', async () => {
    node.resetStats()
    const giga = client()
    const r = await giga.chat({
      model: 'GigaChat',
      messages: [{ role: 'user', content: 'Привет!' }],
      max_tokens: 12,
    })
    expect(node.stats().authRequests).toBe(1)
    expect(r.object).toBe('chat.completion')
    expect(r.choices[0]!.message.role).toBe('assistant')
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(r.choices[0]!.finish_reason!)
    expect(r.usage.total_tokens).toBe(r.usage.prompt_tokens + r.usage.completion_tokens)
    expect(r.usage.precached_prompt_tokens).toBeGreaterThanOrEqual(0)
    expect(r.usage.completion_tokens).toBe(node.stats().completionTokens)
  })

  test('streaming: text chunks, then the last chunk with finish_reason and usage', async () => {
    const giga = client()
    let text = ''
    let last: { choices: { finish_reason?: string }[]; usage?: { completion_tokens: number } } | undefined
    for await (const chunk of giga.stream({
      messages: [{ role: 'user', content: 'Расскажи сказку' }],
      max_tokens: 10,
    })) {
      text += chunk.choices[0]?.delta.content ?? ''
      last = chunk as never
    }
    expect(text.length).toBeGreaterThan(0)
    expect(last!.choices[0]!.finish_reason).toMatch(/stop|length/)
    expect(last!.usage!.completion_tokens).toBeGreaterThan(0)
  })

  test('functions: a function_call with object arguments, and the function result taken back', async () => {
    const giga = client()
    const functions = [
      {
        name: 'weather',
        description: 'Погода в городе',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
      },
    ]
    const r = await giga.chat({
      messages: [{ role: 'user', content: 'Погода в Москве?' }],
      functions,
      function_call: 'auto',
    })
    const m = r.choices[0]!.message
    expect(r.choices[0]!.finish_reason).toBe('function_call')
    expect(m.function_call!.name).toBe('weather')
    expect(typeof m.function_call!.arguments).toBe('object')
    const r2 = await giga.chat({
      messages: [
        { role: 'user', content: 'Погода в Москве?' },
        m,
        { role: 'function', name: 'weather', content: JSON.stringify({ temperature: -5 }) },
      ],
      functions,
    })
    expect(r2.choices[0]!.finish_reason).not.toBe('function_call')
    expect(r2.choices[0]!.message.content!.length).toBeGreaterThan(0)
  })

  test('embeddings: one vector per text with its own usage', async () => {
    const r = await client().embeddings(['первый текст', 'второй'])
    expect(r.data).toHaveLength(2)
    expect(r.data[1]!.index).toBe(1)
    expect(r.data[0]!.embedding.length).toBeGreaterThan(0)
    expect(r.data[0]!.usage.prompt_tokens).toBeGreaterThan(0)
  })

  test('an expired token is a 401; the client logs in again by itself', async () => {
    node.resetStats()
    const giga = client()
    await giga.chat({ messages: [{ role: 'user', content: 'раз' }], max_tokens: 2 })
    await Bun.sleep(500) // the node's tokens live 400 ms
    await giga.chat({ messages: [{ role: 'user', content: 'два' }], max_tokens: 2 })
    expect(node.stats().authRequests).toBe(2)
  })

  test('a wrong authorization key is refused by the OAuth endpoint (401)', async () => {
    const err = await client(btoa('no-colon-here'))
      .chat('hello')
      .catch((e: unknown) => e)
    expect((err as Error).name).toBe('AuthenticationError')
    expect((err as { response: { status: number } }).response.status).toBe(401)
  })

  test('raw HTTP: no RqUID -> 400, no token -> 401 {status, message}, temperature 0 -> 422', async () => {
    const base = `http://127.0.0.1:${node.port}`
    const noRq = await fetch(`${base}/api/v2/oauth`, {
      method: 'POST',
      headers: { authorization: `Basic ${CREDENTIALS}`, 'content-type': 'application/x-www-form-urlencoded' },
      body: 'scope=GIGACHAT_API_PERS',
    })
    expect(noRq.status).toBe(400)
    const noToken = await fetch(`${base}/api/v1/chat/completions`, { method: 'POST', body: '{}' })
    expect(noToken.status).toBe(401)
    expect(await noToken.json()).toEqual({ status: 401, message: 'Unauthorized' })
    const err = await client()
      .chat({ messages: [{ role: 'user', content: 'x' }], temperature: 0 })
      .catch((e: { response: { status: number; data: { status: number; message: string } } }) => e.response)
    expect(err).toMatchObject({ status: 422, data: { status: 422 } })
  })
})

/** The error response of a call the fake must refuse (the test fails if it answers). */
async function refusal(
  p: Promise<unknown>,
): Promise<{ status: number; data: { status: number; message: string } }> {
  const r = await p.then(
    () => undefined,
    (e: { response: { status: number; data: { status: number; message: string } } }) => e.response,
  )
  if (!r) throw new Error('the call was not refused')
  return r
}

// A 1x1 PNG.
const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==',
  'base64',
)

describe('files through the official gigachat client', () => {
  // Tokens that live long enough for a 15 MB upload.
  let node: SimNode
  beforeAll(async () => {
    node = await startSimNode({ name: 'giga-files', protocol: 'gigachat', timeScale: 0, seed: 1 })
  })
  afterAll(() => node.stop())
  const client = () =>
    new GigaChat({
      credentials: CREDENTIALS,
      baseUrl: `http://127.0.0.1:${node.port}/api/v1`,
      authUrl: `http://127.0.0.1:${node.port}/api/v2/oauth`,
      scope: 'GIGACHAT_API_PERS',
      timeout: 10,
    })

  test('uploadFile stores an image (Bearer, multipart); a chat with it in attachments counts it in the prompt', async () => {
    node.resetStats()
    const giga = client()
    const file = await giga.uploadFile(new File([PNG], 'dot.png', { type: 'image/png' }), 'general')
    expect(file).toMatchObject({ object: 'file', bytes: PNG.length, filename: 'dot.png', purpose: 'general' })
    expect(typeof file.id).toBe('string')
    expect(node.stats().uploads).toBe(1)
    expect((await giga.getFile(file.id)).id).toBe(file.id)
    const question = { role: 'user' as const, content: 'Что на картинке?' }
    const plain = await giga.chat({ messages: [question], max_tokens: 4 })
    const withImage = await giga.chat({ messages: [{ ...question, attachments: [file.id] }], max_tokens: 4 })
    // The node counts an image as 85 prompt tokens (render.ts IMAGE_TOKENS).
    expect(withImage.usage.prompt_tokens).toBe(plain.usage.prompt_tokens + 85)
    expect(withImage.choices[0]!.message.content!.length).toBeGreaterThan(0)
  })

  test('an unknown attachment id is refused (400); a deleted file is unknown after', async () => {
    const giga = client()
    const err = await refusal(
      giga.chat({ messages: [{ role: 'user', content: 'x', attachments: ['no-such-file'] }] }),
    )
    expect(err).toMatchObject({ status: 400, data: { status: 400 } })
    expect(err.data.message).toContain('no-such-file')
    const file = await giga.uploadFile(new File([PNG], 'dot.png', { type: 'image/png' }))
    expect((await giga.deleteFile(file.id)).deleted).toBe(true)
    const gone = await refusal(
      giga.chat({ messages: [{ role: 'user', content: 'x', attachments: [file.id] }] }),
    )
    expect(gone.status).toBe(400)
  })

  test('two images in one message are refused (422), as GigaChat takes one per message', async () => {
    const giga = client()
    const a = await giga.uploadFile(new File([PNG], 'a.png', { type: 'image/png' }))
    const b = await giga.uploadFile(new File([PNG], 'b.png', { type: 'image/png' }))
    const err = await refusal(
      giga.chat({ messages: [{ role: 'user', content: 'x', attachments: [a.id, b.id] }] }),
    )
    expect(err.status).toBe(422)
  })

  test('raw HTTP: no token -> 401; over 15 MB -> 413; an unlisted type -> 415', async () => {
    const url = `http://127.0.0.1:${node.port}/api/v1/files`
    const form = () => {
      const f = new FormData()
      f.append('file', new Blob([PNG], { type: 'image/png' }), 'dot.png')
      f.append('purpose', 'general')
      return f
    }
    expect((await fetch(url, { method: 'POST', body: form() })).status).toBe(401)
    const oauth = await fetch(`http://127.0.0.1:${node.port}/api/v2/oauth`, {
      method: 'POST',
      headers: { authorization: `Basic ${CREDENTIALS}`, rquid: crypto.randomUUID() },
      body: 'scope=GIGACHAT_API_PERS',
    })
    const auth = {
      authorization: `Bearer ${((await oauth.json()) as { access_token: string }).access_token}`,
    }
    node.resetStats()
    const big = new FormData()
    big.append('file', new Blob([new Uint8Array(15 * 1024 * 1024 + 1)], { type: 'image/png' }), 'big.png')
    const tooBig = await fetch(url, { method: 'POST', headers: auth, body: big })
    expect(tooBig.status).toBe(413)
    expect(await tooBig.json()).toMatchObject({ status: 413 })
    const gif = new FormData()
    gif.append('file', new Blob([PNG], { type: 'image/gif' }), 'dot.gif')
    expect((await fetch(url, { method: 'POST', headers: auth, body: gif })).status).toBe(415)
    expect((await fetch(url, { method: 'POST', headers: auth, body: form() })).status).toBe(200)
    expect(node.stats().uploads).toBe(1)
  }, 30_000)
})
