import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI, { AzureOpenAI } from 'openai'
import { type SimNode, startSimNode } from '../../src/simulator/index.ts'
import { SIM_AZURE_API_KEY, SIM_FILTER_PROMPT } from '../../src/simulator/protocols/azure.ts'

// The simulated Azure OpenAI resource, checked with openai's own AzureOpenAI client: what the
// official client accepts, not only what Tropa's adapter expects.

let node: SimNode
let endpoint: string
beforeAll(async () => {
  node = await startSimNode({ name: 'azure-sim', timeScale: 0, protocol: 'azure' })
  endpoint = `http://127.0.0.1:${node.port}`
})
afterAll(() => node.stop())

const azure = (apiKey = SIM_AZURE_API_KEY, deployment = 'gpt-4o-dep') =>
  new AzureOpenAI({ endpoint, apiKey, apiVersion: '2024-10-21', deployment, maxRetries: 0 })
const messages = [{ role: 'user' as const, content: 'hello azure' }]

describe('simulated Azure OpenAI through AzureOpenAI', () => {
  test('chat: a completion with usage and Azure filter results', async () => {
    const c = await azure().chat.completions.create({ model: 'ignored', messages })
    expect(c.object).toBe('chat.completion')
    expect(c.model).toBe('gpt-4o-dep')
    expect(typeof c.choices[0]!.message.content).toBe('string')
    expect(c.choices[0]!.finish_reason).toBe('stop')
    expect(c.usage!.prompt_tokens).toBeGreaterThan(0)
    expect(c.usage!.total_tokens).toBe(c.usage!.prompt_tokens + c.usage!.completion_tokens)
    expect((c as unknown as { prompt_filter_results: unknown[] }).prompt_filter_results).toHaveLength(1)
  })

  test('stream: opens with the empty-choices prompt-filter event, ends with usage', async () => {
    const s = await azure().chat.completions.create({
      model: 'ignored',
      messages,
      stream: true,
      stream_options: { include_usage: true },
    })
    const chunks: OpenAI.ChatCompletionChunk[] = []
    for await (const c of s) chunks.push(c)
    const first = chunks[0] as unknown as { choices: unknown[]; id: string; prompt_filter_results: unknown[] }
    expect(first.choices).toEqual([])
    expect(first.id).toBe('')
    expect(first.prompt_filter_results).toHaveLength(1)
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')
    expect(text.length).toBeGreaterThan(0)
    const last = chunks.at(-1)!
    expect(last.choices).toEqual([])
    expect(last.usage!.completion_tokens).toBeGreaterThan(0)
    expect(chunks.some((c) => c.choices[0]?.finish_reason === 'stop')).toBe(true)
  })

  test('embeddings', async () => {
    const e = await azure('sim-azure-key', 'embed-dep').embeddings.create({ model: 'x', input: ['a', 'b c'] })
    expect(e.data).toHaveLength(2)
    expect(e.data[0]!.embedding.length).toBeGreaterThan(0)
    expect(e.usage.prompt_tokens).toBeGreaterThan(0)
  })

  test('a wrong key is an AuthenticationError with Azure’s body', async () => {
    const err = await azure('wrong-key')
      .chat.completions.create({ model: 'x', messages })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError)
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).status).toBe(401)
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).message).toContain('Access denied')
  })

  test('no api-version: 404 Resource not found; a malformed one: 400', async () => {
    const url = `${endpoint}/openai/deployments/d/chat/completions`
    const init = {
      method: 'POST',
      headers: { 'api-key': SIM_AZURE_API_KEY, 'content-type': 'application/json' },
      body: JSON.stringify({ messages }),
    }
    const none = await fetch(url, init)
    expect(none.status).toBe(404)
    expect(await none.json()).toEqual({ error: { code: '404', message: 'Resource not found' } })
    const bad = await fetch(`${url}?api-version=latest`, init)
    expect(bad.status).toBe(400)
    expect(((await bad.json()) as { error: { message: string } }).error.message).toBe(
      'API version not supported',
    )
  })

  test('a filtered prompt is a BadRequestError with code content_filter', async () => {
    const err = await azure()
      .chat.completions.create({
        model: 'x',
        messages: [{ role: 'user', content: `a ${SIM_FILTER_PROMPT}` }],
      })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('content_filter')
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe('prompt')
  })
})
