import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa
beforeAll(async () => {
  t = await startTropa()
})
afterAll(() => t.stop())

const norm = (v: number[]) => Math.sqrt(v.reduce((s, x) => s + x * x, 0))

describe('embeddings through the official SDK', () => {
  test('one string: a unit vector of the native size, our model id, usage', async () => {
    const r = await t
      .client()
      .embeddings.create({ model: 'test/embed', input: 'hello world', encoding_format: 'float' })
    expect(r.object).toBe('list')
    expect(r.model).toBe('test/embed')
    expect(r.data.length).toBe(1)
    expect(r.data[0]!.object).toBe('embedding')
    expect(r.data[0]!.embedding.length).toBe(256)
    expect(norm(r.data[0]!.embedding)).toBeCloseTo(1, 4)
    expect(r.usage.prompt_tokens).toBeGreaterThan(0)
  })

  test('many inputs with dimensions; deterministic per text', async () => {
    const input = ['alpha', 'beta', 'alpha']
    const r = await t
      .client()
      .embeddings.create({ model: 'test/embed', input, dimensions: 64, encoding_format: 'float' })
    expect(r.data.map((d) => d.index)).toEqual([0, 1, 2])
    for (const d of r.data) expect(d.embedding.length).toBe(64)
    expect(r.data[0]!.embedding).toEqual(r.data[2]!.embedding)
    expect(r.data[0]!.embedding).not.toEqual(r.data[1]!.embedding)
  })

  test('base64 encoding decodes to the same floats', async () => {
    const raw = await t.fetch('/v1/embeddings', {
      method: 'POST',
      body: JSON.stringify({
        model: 'test/embed',
        input: 'gamma',
        dimensions: 32,
        encoding_format: 'base64',
      }),
    })
    const b64 = ((await raw.json()) as { data: { embedding: string }[] }).data[0]!.embedding
    expect(typeof b64).toBe('string')
    const floats = Array.from(new Float32Array(Buffer.from(b64, 'base64').buffer.slice(0)))
    // The SDK asks for base64 by default and decodes it itself.
    const viaSdk = await t.client().embeddings.create({ model: 'test/embed', input: 'gamma', dimensions: 32 })
    expect(viaSdk.data[0]!.embedding).toEqual(floats)
  })

  test('2048 inputs are accepted', async () => {
    const r = await t.client().embeddings.create({
      model: 'test/embed',
      input: Array.from({ length: 2048 }, (_, i) => `t${i}`),
      dimensions: 8,
    })
    expect(r.data.length).toBe(2048)
  })

  test('token-array input passes through', async () => {
    const r = await t.client().embeddings.create({
      model: 'test/embed',
      input: [
        [1, 2, 3],
        [4, 5],
      ],
      encoding_format: 'float',
    })
    expect(r.data.length).toBe(2)
  })
})
