import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { ADMIN_TOKEN, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa
let revokedKey: string
let disabledKey: string
beforeAll(async () => {
  t = await startTropa({ maxBodyBytes: 256 * 1024 })
  const r = await newApiKey(t, { name: 'to-revoke' })
  await t.fetch(`/v1/keys/${r.key_id}`, { method: 'DELETE', key: t.masterKey })
  revokedKey = r.key
  const d = await newApiKey(t, { name: 'to-disable' })
  await t.fetch(`/v1/keys/${d.key_id}`, {
    method: 'PATCH',
    key: t.masterKey,
    body: JSON.stringify({ disabled: true }),
  })
  disabledKey = d.key
})
afterAll(() => t.stop())

const user = [{ role: 'user', content: 'hi' }]
const chat = (extra: Record<string, unknown>) => ({ model: 'test/chat', messages: user, ...extra })

type Auth = 'api' | 'master' | 'none' | 'revoked' | 'disabled' | string
interface Case {
  name: string
  method?: string
  path?: string
  body?: unknown
  raw?: string
  auth?: Auth
  headers?: Record<string, string>
  status: number
  code: string
  param?: string
}

const CASES: Case[] = [
  // body syntax and media type
  { name: 'invalid JSON', raw: '{"model": "test/chat",', status: 400, code: 'invalid_json' },
  { name: 'empty body', raw: '', status: 400, code: 'invalid_json' },
  { name: 'JSON array body', raw: '[1,2]', status: 400, code: 'invalid_value' },
  { name: 'JSON string body', raw: '"hello"', status: 400, code: 'invalid_value' },
  { name: 'JSON null body', raw: 'null', status: 400, code: 'invalid_value' },
  {
    name: 'text/plain body',
    raw: JSON.stringify(chat({})),
    headers: { 'content-type': 'text/plain' },
    status: 415,
    code: 'unsupported_media_type',
  },
  {
    name: 'form body',
    raw: 'model=x',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    status: 415,
    code: 'unsupported_media_type',
  },
  {
    name: 'oversize body',
    raw: JSON.stringify(chat({ messages: [{ role: 'user', content: 'x'.repeat(300_000) }] })),
    status: 413,
    code: 'payload_too_large',
  },
  // fields
  { name: 'missing model', body: { messages: user }, status: 400, code: 'missing_field', param: 'model' },
  {
    name: 'missing messages',
    body: { model: 'test/chat' },
    status: 400,
    code: 'missing_field',
    param: 'messages',
  },
  {
    name: 'empty messages',
    body: chat({ messages: [] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages',
  },
  {
    name: 'model a number',
    body: { model: 5, messages: user },
    status: 400,
    code: 'invalid_value',
    param: 'model',
  },
  {
    name: 'empty model',
    body: { model: '', messages: user },
    status: 400,
    code: 'invalid_value',
    param: 'model',
  },
  {
    name: 'messages an object',
    body: chat({ messages: { role: 'user' } }),
    status: 400,
    code: 'invalid_value',
    param: 'messages',
  },
  {
    name: 'message a string',
    body: chat({ messages: ['hi'] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[0]',
  },
  {
    name: 'bad role',
    body: chat({ messages: [{ role: 'wizard', content: 'x' }] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[0].role',
  },
  {
    name: 'missing role',
    body: chat({ messages: [{ content: 'x' }] }),
    status: 400,
    code: 'missing_field',
    param: 'messages[0].role',
  },
  {
    name: 'user without content',
    body: chat({ messages: [{ role: 'user' }] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[0].content',
  },
  {
    name: 'user content null',
    body: chat({ messages: [{ role: 'user', content: null }] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[0].content',
  },
  {
    name: 'content a number',
    body: chat({ messages: [{ role: 'user', content: 7 }] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[0].content',
  },
  {
    name: 'bad content part type',
    body: chat({ messages: [{ role: 'user', content: [{ type: 'video', url: 'x' }] }] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[0].content',
  },
  {
    name: 'image part without url',
    body: chat({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: {} }] }] }),
    status: 400,
    code: 'missing_field',
    param: 'messages[0].content[0].image_url.url',
  },
  {
    name: 'tool message without tool_call_id',
    body: chat({ messages: [...user, { role: 'tool', content: 'r' }] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[1].tool_call_id',
  },
  {
    name: 'assistant without content or tool_calls',
    body: chat({ messages: [...user, { role: 'assistant' }] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[1].content',
  },
  {
    name: 'system message with an image',
    body: chat({ messages: [{ role: 'system', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }),
    status: 400,
    code: 'invalid_value',
    param: 'messages[0].content',
  },
  {
    name: 'temperature 2.5',
    body: chat({ temperature: 2.5 }),
    status: 400,
    code: 'invalid_value',
    param: 'temperature',
  },
  {
    name: 'temperature -0.1',
    body: chat({ temperature: -0.1 }),
    status: 400,
    code: 'invalid_value',
    param: 'temperature',
  },
  {
    name: 'temperature a string',
    body: chat({ temperature: 'hot' }),
    status: 400,
    code: 'invalid_value',
    param: 'temperature',
  },
  { name: 'top_p 1.5', body: chat({ top_p: 1.5 }), status: 400, code: 'invalid_value', param: 'top_p' },
  {
    name: 'max_tokens 0',
    body: chat({ max_tokens: 0 }),
    status: 400,
    code: 'invalid_value',
    param: 'max_tokens',
  },
  {
    name: 'max_tokens -1',
    body: chat({ max_tokens: -1 }),
    status: 400,
    code: 'invalid_value',
    param: 'max_tokens',
  },
  {
    name: 'max_tokens 1.5',
    body: chat({ max_tokens: 1.5 }),
    status: 400,
    code: 'invalid_value',
    param: 'max_tokens',
  },
  {
    name: 'max_tokens huge',
    body: chat({ max_tokens: 1_000_000_000 }),
    status: 400,
    code: 'context_length_exceeded',
  },
  {
    name: 'max_completion_tokens huge',
    body: chat({ max_completion_tokens: 5000 }),
    status: 400,
    code: 'context_length_exceeded',
  },
  {
    name: 'prompt beyond the context',
    body: chat({ messages: [{ role: 'user', content: 'word '.repeat(5000) }] }),
    status: 400,
    code: 'context_length_exceeded',
  },
  { name: 'n 0', body: chat({ n: 0 }), status: 400, code: 'invalid_value', param: 'n' },
  {
    name: 'stream a string',
    body: chat({ stream: 'yes' }),
    status: 400,
    code: 'invalid_value',
    param: 'stream',
  },
  {
    name: 'presence_penalty 3',
    body: chat({ presence_penalty: 3 }),
    status: 400,
    code: 'invalid_value',
    param: 'presence_penalty',
  },
  {
    name: 'stop with 5 strings',
    body: chat({ stop: ['a', 'b', 'c', 'd', 'e'] }),
    status: 400,
    code: 'invalid_value',
    param: 'stop',
  },
  {
    name: 'tools not an array',
    body: chat({ tools: { type: 'function' } }),
    status: 400,
    code: 'invalid_value',
    param: 'tools',
  },
  {
    name: 'tool without function',
    body: chat({ tools: [{ type: 'function' }] }),
    status: 400,
    code: 'missing_field',
    param: 'tools[0].function',
  },
  {
    name: 'tool_choice nonsense',
    body: chat({ tool_choice: 'sometimes' }),
    status: 400,
    code: 'invalid_value',
    param: 'tool_choice',
  },
  {
    name: 'unknown model',
    body: { model: 'nope/nothing', messages: user },
    status: 404,
    code: 'model_not_found',
    param: 'model',
  },
  {
    name: 'embedding model on chat',
    body: { model: 'test/embed', messages: user },
    status: 400,
    code: 'invalid_value',
    param: 'model',
  },
  // embeddings
  {
    name: 'embeddings: 2049 inputs',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: Array(2049).fill('a') },
    status: 400,
    code: 'too_many_inputs',
    param: 'input',
  },
  {
    name: 'embeddings: empty string',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: '' },
    status: 400,
    code: 'invalid_value',
    param: 'input',
  },
  {
    name: 'embeddings: empty array',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: [] },
    status: 400,
    code: 'invalid_value',
    param: 'input',
  },
  {
    name: 'embeddings: empty item',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: ['a', ''] },
    status: 400,
    code: 'invalid_value',
    param: 'input[1]',
  },
  {
    name: 'embeddings: input a number',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: 5 },
    status: 400,
    code: 'invalid_value',
    param: 'input',
  },
  {
    name: 'embeddings: missing input',
    path: '/v1/embeddings',
    body: { model: 'test/embed' },
    status: 400,
    code: 'missing_field',
    param: 'input',
  },
  {
    name: 'embeddings: dimensions above native',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: 'a', dimensions: 4096 },
    status: 400,
    code: 'invalid_value',
    param: 'dimensions',
  },
  {
    name: 'embeddings: dimensions 0',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: 'a', dimensions: 0 },
    status: 400,
    code: 'invalid_value',
    param: 'dimensions',
  },
  {
    name: 'embeddings: bad encoding_format',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: 'a', encoding_format: 'hex' },
    status: 400,
    code: 'invalid_value',
    param: 'encoding_format',
  },
  {
    name: 'embeddings: chat model',
    path: '/v1/embeddings',
    body: { model: 'test/chat', input: 'a' },
    status: 400,
    code: 'invalid_value',
    param: 'model',
  },
  {
    name: 'embeddings: input too long',
    path: '/v1/embeddings',
    body: { model: 'test/embed', input: 'word '.repeat(3000) },
    status: 400,
    code: 'context_length_exceeded',
  },
  // authentication and permissions
  { name: 'no Authorization', auth: 'none', body: chat({}), status: 401, code: 'missing_api_key' },
  { name: 'Basic scheme', auth: 'Basic dXNlcjpwYXNz', body: chat({}), status: 401, code: 'invalid_api_key' },
  { name: 'Bearer with nothing', auth: 'Bearer ', body: chat({}), status: 401, code: 'missing_api_key' },
  {
    name: 'unknown key',
    auth: `Bearer sk-${'a'.repeat(43)}`,
    body: chat({}),
    status: 401,
    code: 'invalid_api_key',
  },
  {
    name: 'garbage token',
    auth: "Bearer sk-' OR 1=1; --",
    body: chat({}),
    status: 401,
    code: 'invalid_api_key',
  },
  { name: 'revoked key', auth: 'revoked', body: chat({}), status: 401, code: 'key_revoked' },
  { name: 'disabled key', auth: 'disabled', body: chat({}), status: 401, code: 'key_disabled' },
  { name: 'master key on chat', auth: 'master', body: chat({}), status: 403, code: 'permission_denied' },
  {
    name: 'master key on models',
    auth: 'master',
    method: 'GET',
    path: '/v1/models',
    status: 403,
    code: 'permission_denied',
  },
  { name: 'API key on keys', method: 'GET', path: '/v1/keys', status: 403, code: 'permission_denied' },
  {
    name: 'API key on admin',
    path: '/v1/admin/organizations',
    body: { name: 'x' },
    status: 403,
    code: 'permission_denied',
  },
  {
    name: 'keys: missing name',
    auth: 'master',
    path: '/v1/keys',
    body: {},
    status: 400,
    code: 'missing_field',
    param: 'name',
  },
  {
    name: 'keys: negative limit',
    auth: 'master',
    path: '/v1/keys',
    body: { name: 'x', limit_rub: -1 },
    status: 400,
    code: 'invalid_value',
    param: 'limit_rub',
  },
  {
    name: 'keys: limit with 7 digits',
    auth: 'master',
    path: '/v1/keys',
    body: { name: 'x', limit_rub: 0.0000001 },
    status: 400,
    code: 'invalid_value',
    param: 'limit_rub',
  },
  {
    name: 'keys: limit over one billion roubles',
    auth: 'master',
    path: '/v1/keys',
    body: { name: 'x', limit_rub: 1e20 },
    status: 400,
    code: 'invalid_value',
    param: 'limit_rub',
  },
  {
    name: 'admin: opening balance over one billion roubles',
    auth: `Bearer ${ADMIN_TOKEN}`,
    path: '/v1/admin/organizations',
    body: { name: 'too-rich', balance_rub: 1_000_000_000.000001 },
    status: 400,
    code: 'invalid_value',
    param: 'balance_rub',
  },
  {
    name: 'keys: unknown field',
    auth: 'master',
    path: '/v1/keys',
    body: { name: 'x', colour: 'red' },
    status: 400,
    code: 'invalid_value',
  },
  {
    name: 'keys: name too long',
    auth: 'master',
    path: '/v1/keys',
    body: { name: 'x'.repeat(129) },
    status: 400,
    code: 'invalid_value',
    param: 'name',
  },
  {
    name: 'keys: unknown key id',
    auth: 'master',
    method: 'DELETE',
    path: '/v1/keys/key_nope',
    status: 404,
    code: 'key_not_found',
  },
  {
    name: 'keys: bad list limit',
    auth: 'master',
    method: 'GET',
    path: '/v1/keys?limit=0',
    status: 400,
    code: 'invalid_value',
    param: 'limit',
  },
  // paths and methods
  { name: 'unknown path', method: 'GET', path: '/v1/nothing', status: 404, code: 'unknown_path' },
  { name: 'unknown path outside /v1', method: 'GET', path: '/wp-admin', status: 404, code: 'unknown_path' },
  {
    name: 'GET on chat',
    method: 'GET',
    path: '/v1/chat/completions',
    status: 405,
    code: 'method_not_allowed',
  },
  {
    name: 'PUT on keys',
    auth: 'master',
    method: 'PUT',
    path: '/v1/keys',
    body: {},
    status: 405,
    code: 'method_not_allowed',
  },
]

describe('malformed requests get the right 4xx in the OpenAI shape', () => {
  test.each(CASES.map((c) => [c.name, c] as const))('%s', async (_name, c) => {
    const headers: Record<string, string> = { 'content-type': 'application/json', ...c.headers }
    const auth = c.auth ?? 'api'
    const secret = { api: t.apiKey, master: t.masterKey, revoked: revokedKey, disabled: disabledKey }[
      auth as 'api'
    ]
    if (secret) headers.authorization = `Bearer ${secret}`
    else if (auth !== 'none') headers.authorization = auth
    const body = c.raw ?? (c.body === undefined ? undefined : JSON.stringify(c.body))
    const res = await fetch(`${t.url}${c.path ?? '/v1/chat/completions'}`, {
      method: c.method ?? 'POST',
      headers,
      ...(body !== undefined && { body }),
    })
    const json = (await res.json()) as {
      error: { message: string; type: string; param: string | null; code: string }
    }
    expect({ status: res.status, code: json.error.code }).toEqual({ status: c.status, code: c.code })
    expect(typeof json.error.message).toBe('string')
    expect(typeof json.error.type).toBe('string')
    if (c.param) expect(json.error.param).toBe(c.param)
    expect(res.headers.get('x-request-id')).toMatch(/^[0-9A-Za-z]{24}$/)
    if (res.status !== 429) expect(res.headers.get('x-should-retry')).toBe('false')
  })

  test('there are at least 50 cases', () => expect(CASES.length).toBeGreaterThanOrEqual(50))

  test('the server keeps serving after all of them', async () => {
    const r = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages: [{ role: 'user', content: 'still there?' }] })
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
  })
})

describe('the SDK raises its typed errors', () => {
  test('AuthenticationError for a revoked key', async () => {
    const err = await t
      .client(revokedKey)
      .chat.completions.create({ model: 'test/chat', messages: [{ role: 'user', content: 'x' }] })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError)
    expect(err.code).toBe('key_revoked')
  })
  test('NotFoundError for an unknown model', async () => {
    const err = await t
      .client()
      .chat.completions.create({ model: 'x/y', messages: [{ role: 'user', content: 'x' }] })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.NotFoundError)
    expect(err.code).toBe('model_not_found')
  })
  test('BadRequestError for bad input', async () => {
    const err = await t
      .client()
      .chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'x' }],
        temperature: 2.5,
      })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect(err.param).toBe('temperature')
  })
  test('PermissionDeniedError for a master key on a model endpoint', async () => {
    const err = await t
      .client(t.masterKey)
      .embeddings.create({ model: 'test/embed', input: 'x' })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.PermissionDeniedError)
  })
})
