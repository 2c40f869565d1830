import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type OpenAI from 'openai'
import { EACH, expectBilled, meter, startMatrix } from '../helpers/matrix.ts'
import type { Tropa } from '../helpers/start.ts'

// The matrix, inbound legacy /v1/completions (openai SDK) x every upstream provider kind: plain
// and streamed (the legacy API has no tools); usage and cost exact.

let t: Tropa
let client: OpenAI
beforeAll(async () => {
  t = await startMatrix()
  client = t.client()
}, 30_000)
afterAll(() => t.stop())

const prompt = 'Write a line about rivers'
const seen = (u: OpenAI.CompletionUsage | undefined) => {
  expect(u!.total_tokens).toBe(u!.prompt_tokens + u!.completion_tokens)
  return {
    prompt: u!.prompt_tokens,
    completion: u!.completion_tokens,
    costRub: (u as unknown as { cost_rub?: number }).cost_rub,
  }
}

describe.each(EACH)('completions x %s', (_kind, p) => {
  test('plain: a text_completion, its usage the node’s, the cost exact', async () => {
    const m = meter(t, p)
    const { data, response } = await client.completions
      .create({ model: p.model, prompt, max_tokens: 24 })
      .withResponse()
    expect(data.object).toBe('text_completion')
    expect(data.id).toMatch(/^cmpl-/)
    expect(data.model).toBe(p.model)
    expect(data.choices).toHaveLength(1)
    expect(data.choices[0]!.index).toBe(0)
    expect(data.choices[0]!.text.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(data.choices[0]!.finish_reason)
    await expectBilled(
      t,
      p,
      response.headers.get('x-request-id')!,
      { ...seen(data.usage), header: response.headers.get('x-tropa-cost-rub') },
      m.take(),
    )
  })

  test('streamed: text_completion chunks, the usage chunk, the cost exact', async () => {
    const m = meter(t, p)
    const { data: stream, response } = await client.completions
      .create({
        model: p.model,
        prompt,
        max_tokens: 24,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const chunks: OpenAI.Completion[] = []
    for await (const c of stream) chunks.push(c)
    const id = chunks[0]!.id
    expect(id).toMatch(/^cmpl-/)
    for (const c of chunks) {
      expect(c.object).toBe('text_completion')
      expect(c.id).toBe(id)
      expect(c.model).toBe(p.model)
    }
    const text = chunks.map((c) => c.choices[0]?.text ?? '').join('')
    expect(text.length).toBeGreaterThan(0)
    const finishes = chunks.map((c) => c.choices[0]?.finish_reason).filter((f) => f != null)
    expect(finishes).toHaveLength(1)
    expect(['stop', 'length']).toContain(finishes[0]!)
    const last = chunks.at(-1)!
    expect(last.choices).toEqual([])
    await expectBilled(t, p, response.headers.get('x-request-id')!, seen(last.usage), m.take())
  })
})
