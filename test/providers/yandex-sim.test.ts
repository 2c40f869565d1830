import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { type SimNode, startSimNode } from '../../src/simulator/index.ts'

// The simulated Yandex Foundation Models front, checked with plain fetch against the REST
// reference (there is no official JS SDK): auth, x-folder-id, string token counts, and the stream
// of newline-delimited JSON objects each holding the whole text so far.

const FOLDER = 'b1gsimfolder'
let node: SimNode
let base: string
beforeAll(async () => {
  node = await startSimNode({ name: 'ya', protocol: 'yandex', timeScale: 0, seed: 2 })
  base = `http://127.0.0.1:${node.port}/foundationModels/v1`
})
afterAll(() => node.stop())

const headers = {
  authorization: 'Api-Key AQVNsimkey',
  'x-folder-id': FOLDER,
  'content-type': 'application/json',
}
const request = (stream: boolean, extra: Record<string, unknown> = {}) =>
  JSON.stringify({
    modelUri: `gpt://${FOLDER}/yandexgpt/latest`,
    completionOptions: { stream, temperature: 0.3, maxTokens: '12' },
    messages: [
      { role: 'system', text: 'Ты помощник.' },
      { role: 'user', text: 'Привет!' },
    ],
    ...extra,
  })

describe('the Yandex Foundation Models fake over plain HTTP', () => {
  test('completion: alternatives, a final status, usage as strings, modelVersion', async () => {
    const res = await fetch(`${base}/completion`, { method: 'POST', headers, body: request(false) })
    expect(res.status).toBe(200)
    const { result } = (await res.json()) as {
      result: {
        alternatives: { message: { role: string; text: string }; status: string }[]
        usage: Record<string, unknown>
        modelVersion: string
      }
    }
    expect(result.alternatives[0]!.message.role).toBe('assistant')
    expect(result.alternatives[0]!.message.text.length).toBeGreaterThan(0)
    expect(result.alternatives[0]!.status).toMatch(/^ALTERNATIVE_STATUS_(FINAL|TRUNCATED_FINAL)$/)
    for (const k of ['inputTextTokens', 'completionTokens', 'totalTokens'])
      expect(result.usage[k]).toMatch(/^\d+$/)
    expect(Number(result.usage.totalTokens)).toBe(
      Number(result.usage.inputTextTokens) + Number(result.usage.completionTokens),
    )
    expect(typeof result.modelVersion).toBe('string')
  })

  test('streaming: one JSON object per line, each with the whole text so far, the last one final', async () => {
    const res = await fetch(`${base}/completion`, { method: 'POST', headers, body: request(true) })
    expect(res.status).toBe(200)
    const lines = (await res.text()).split('\n').filter(Boolean)
    expect(lines.length).toBeGreaterThan(2)
    const results = lines.map(
      (l) =>
        (
          JSON.parse(l) as {
            result: {
              alternatives: { message: { text: string }; status: string }[]
              usage: Record<string, string>
            }
          }
        ).result,
    )
    for (let i = 1; i < results.length; i++)
      expect(
        results[i]!.alternatives[0]!.message.text.startsWith(results[i - 1]!.alternatives[0]!.message.text),
      ).toBe(true)
    for (const r of results.slice(0, -1)) expect(r.alternatives[0]!.status).toBe('ALTERNATIVE_STATUS_PARTIAL')
    const last = results.at(-1)!
    expect(last.alternatives[0]!.status).toMatch(/FINAL/)
    expect(last.usage.completionTokens).toMatch(/^[1-9]\d*$/)
  })

  test('auth: no key -> 401, a folder other than the modelUri one -> 403, both in the error shape', async () => {
    const noKey = await fetch(`${base}/completion`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: request(false),
    })
    expect(noKey.status).toBe(401)
    expect(((await noKey.json()) as { error: { httpCode: number; grpcCode: number } }).error).toMatchObject({
      httpCode: 401,
      grpcCode: 16,
    })
    const iam = await fetch(`${base}/completion`, {
      method: 'POST',
      headers: { ...headers, authorization: 'Bearer t1.simiamtoken' },
      body: request(false),
    })
    expect(iam.status).toBe(200)
    const iamAsKey = await fetch(`${base}/completion`, {
      method: 'POST',
      headers: { ...headers, authorization: 'Api-Key t1.simiamtoken' },
      body: request(false),
    })
    expect(iamAsKey.status).toBe(401)
    const other = await fetch(`${base}/completion`, {
      method: 'POST',
      headers: { ...headers, 'x-folder-id': 'b1gother' },
      body: request(false),
    })
    expect(other.status).toBe(403)
  })

  test('a bad request is a 400 with {error: {grpcCode 3, httpCode 400, message, httpStatus}}', async () => {
    const res = await fetch(`${base}/completion`, {
      method: 'POST',
      headers,
      body: request(false, { messages: [{ role: 'user', text: '' }] }),
    })
    expect(res.status).toBe(400)
    const { error } = (await res.json()) as { error: Record<string, unknown> }
    expect(error).toMatchObject({ grpcCode: 3, httpCode: 400, httpStatus: 'Bad Request' })
    expect(String(error.message)).toContain('empty')
  })

  test('tools: a toolCallList with object arguments and status TOOL_CALLS; a toolResultList taken back', async () => {
    const tools = [
      {
        function: {
          name: 'weatherTool',
          description: 'Getting current weather in the specified city.',
          parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
        },
      },
    ]
    const q = { role: 'user', text: 'What is the weather like in Saint Petersburg?' }
    const res = await fetch(`${base}/completion`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ modelUri: `gpt://${FOLDER}/yandexgpt`, tools, messages: [q] }),
    })
    const { result } = (await res.json()) as {
      result: { alternatives: { message: { toolCallList: { toolCalls: unknown[] } }; status: string }[] }
    }
    expect(result.alternatives[0]!.status).toBe('ALTERNATIVE_STATUS_TOOL_CALLS')
    const call = result.alternatives[0]!.message.toolCallList.toolCalls[0] as {
      functionCall: { name: string; arguments: unknown }
    }
    expect(call.functionCall.name).toBe('weatherTool')
    expect(typeof call.functionCall.arguments).toBe('object')
    const res2 = await fetch(`${base}/completion`, {
      method: 'POST',
      headers,
      body: JSON.stringify({
        modelUri: `gpt://${FOLDER}/yandexgpt`,
        tools,
        messages: [
          q,
          result.alternatives[0]!.message,
          {
            role: 'assistant',
            toolResultList: { toolResults: [{ functionResult: { name: 'weatherTool', content: '8°C' } }] },
          },
        ],
      }),
    })
    const r2 = (await res2.json()) as {
      result: { alternatives: { message: { text: string }; status: string }[] }
    }
    expect(r2.result.alternatives[0]!.status).toMatch(/FINAL/)
    expect(r2.result.alternatives[0]!.message.text.length).toBeGreaterThan(0)
  })

  test('textEmbedding: one text, its vector and numTokens as a string', async () => {
    const res = await fetch(`${base}/textEmbedding`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ modelUri: `emb://${FOLDER}/text-search-doc/latest`, text: 'Привет, мир' }),
    })
    expect(res.status).toBe(200)
    const r = (await res.json()) as { embedding: number[]; numTokens: string; modelVersion: string }
    expect(r.embedding.length).toBeGreaterThan(0)
    expect(r.numTokens).toMatch(/^[1-9]\d*$/)
  })
})
