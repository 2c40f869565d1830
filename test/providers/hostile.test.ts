import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type { ModelFile } from '../../src/config/schema.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// GigaChat and Yandex upstreams that misbehave: their answers are untrusted input. A translated
// reply or stream that is broken is the node's failure (failover before the first byte, an error
// event after it), never a 5xx from Tropa's own code; usage that is not sane is replaced by
// Tropa's count; no line is buffered without bound.

let mode = ''
let t: Tropa
let fake: ReturnType<typeof Bun.serve>

const yandexLine = (text: string, status: string, usage: Record<string, string>) =>
  `${JSON.stringify({ result: { alternatives: [{ message: { role: 'assistant', text }, status }], usage, modelVersion: 'x' } })}\n`

beforeAll(async () => {
  fake = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    fetch(req) {
      const path = new URL(req.url).pathname
      if (path === '/api/v2/oauth')
        return Response.json({ access_token: 'tok', expires_at: Date.now() + 3_600_000 })
      if (path === '/foundationModels/v1/completion') {
        if (mode === 'ya-usage')
          return new Response(
            yandexLine('hello there', 'ALTERNATIVE_STATUS_FINAL', {
              inputTextTokens: '-5',
              completionTokens: '1e9',
              totalTokens: 'x',
            }),
          )
        if (mode === 'ya-stream-shrinks')
          return new Response(
            [
              yandexLine('hello', 'ALTERNATIVE_STATUS_PARTIAL', {}),
              yandexLine('hello there', 'ALTERNATIVE_STATUS_PARTIAL', {}),
              yandexLine('hel', 'ALTERNATIVE_STATUS_PARTIAL', {}),
              yandexLine('hello there', 'ALTERNATIVE_STATUS_FINAL', {
                inputTextTokens: '3',
                completionTokens: '2',
                totalTokens: '5',
              }),
            ].join(''),
          )
        if (mode === 'ya-error-line')
          return new Response(
            `${yandexLine('hello', 'ALTERNATIVE_STATUS_PARTIAL', {})}${JSON.stringify({ error: { grpcCode: 13, httpCode: 500, message: 'internal', httpStatus: 'Internal Server Error' } })}\n`,
          )
      }
      if (path === '/api/v1/chat/completions') {
        if (mode === 'giga-not-json')
          return new Response('<html>oops</html>', { headers: { 'content-type': 'text/html' } })
        if (mode === 'giga-long-line')
          return new Response(
            `data: ${JSON.stringify({ choices: [{ delta: { content: 'hi', role: 'assistant' }, index: 0 }] })}\n\ndata: {"x":"${'a'.repeat(2 << 20)}`,
            { headers: { 'content-type': 'text/event-stream' } },
          )
      }
      return new Response('{"status":404,"message":"no"}', { status: 404 })
    },
  })
  const base = `http://127.0.0.1:${fake.port}`
  const models: ModelFile[] = [
    {
      id: 'yandex/hostile',
      kind: 'chat',
      context_length: 4096,
      pricing: CHAT_PRICE,
      routes: [
        {
          name: 'ya-fake',
          provider: 'yandex',
          base_url: base,
          folder_id: 'b1g',
          api_key_env: 'K',
          upstream_model: 'yandexgpt/latest',
        },
      ],
    },
    {
      id: 'gigachat/hostile',
      kind: 'chat',
      context_length: 4096,
      pricing: CHAT_PRICE,
      routes: [
        {
          name: 'giga-fake',
          provider: 'gigachat',
          base_url: `${base}/api/v1`,
          auth_url: `${base}/api/v2/oauth`,
          api_key_env: 'K',
          upstream_model: 'GigaChat',
        },
      ],
    },
  ]
  t = await startTropa({ nodes: [], models: () => models, env: { K: btoa('a:b') } })
})
afterAll(async () => {
  await t.stop()
  fake.stop(true)
})

const ask = (model: string, extra: Record<string, unknown> = {}) =>
  t.fetch('/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 20, ...extra }),
  })
async function lastRow() {
  await t.svc.ledger.flush()
  return (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000))
    .filter((r) => r.kind === 'usage')
    .at(-1)!
}

describe('hostile gigachat and yandex upstreams', () => {
  test('yandex token counts that are not decimal strings are not billed: Tropa counts itself', async () => {
    mode = 'ya-usage'
    const res = await ask('yandex/hostile')
    expect(res.status).toBe(200)
    const body = (await res.json()) as { usage: Record<string, unknown> }
    expect(body.usage).toMatchObject({ completion_tokens: 2, estimated: true })
    expect((await lastRow()).estimated).toBe(true)
  })

  test('a yandex stream whose cumulative text shrinks sends no text twice', async () => {
    mode = 'ya-stream-shrinks'
    const text = await (await ask('yandex/hostile', { stream: true })).text()
    const content = text
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map(
        (e) =>
          (JSON.parse(e.slice(6)) as { choices: { delta: { content?: string } }[] }).choices[0]?.delta
            .content ?? '',
      )
      .join('')
    expect(content).toBe('hello there')
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true)
  })

  test('an error line in a yandex stream ends it with an error event, the text sent billed', async () => {
    mode = 'ya-error-line'
    const res = await ask('yandex/hostile', { stream: true })
    expect(res.status).toBe(200)
    const events = (await res.text()).split('\n\n').filter(Boolean)
    expect(events).not.toContain('data: [DONE]')
    expect((JSON.parse(events.at(-1)!.slice(6)) as { error?: { code: string } }).error?.code).toBe(
      'upstream_error',
    )
    expect(await lastRow()).toMatchObject({ estimated: true, completionTokens: 1 })
  })

  test('a gigachat reply that is not JSON is the node failing (502), not a crash', async () => {
    mode = 'giga-not-json'
    const res = await ask('gigachat/hostile')
    expect(res.status).toBe(502)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('upstream_error')
  })

  test('a gigachat stream line over 1 MiB ends the stream with an error event instead of buffering it', async () => {
    mode = 'giga-long-line'
    const res = await ask('gigachat/hostile', { stream: true })
    const events = (await res.text()).split('\n\n').filter(Boolean)
    expect(events.length).toBeLessThan(5)
    expect((JSON.parse(events.at(-1)!.slice(6)) as { error?: { code: string } }).error?.code).toBe(
      'upstream_error',
    )
  })
})
