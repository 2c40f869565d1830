import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { encode } from 'gpt-tokenizer'
import OpenAI from 'openai'
import { type SimFaults, type SimNode, startSimNode } from '../../src/simulator/index.ts'
import { vocabulary } from '../../src/simulator/text.ts'
import { loadTokenizer } from '../../src/tokenizer.ts'

let fast: SimNode
let timed: SimNode
beforeAll(async () => {
  fast = await startSimNode({ name: 'fast', timeScale: 0 })
  timed = await startSimNode({ name: 'timed', itlMs: 2, prefillTokensPerSec: 100_000 })
})
afterAll(async () => {
  await fast.stop()
  await timed.stop()
})
const client = (n: SimNode) => new OpenAI({ baseURL: n.url, apiKey: 'x', maxRetries: 0 })
const messages = [{ role: 'user' as const, content: 'hello there' }]
const post = (n: SimNode, body: unknown, signal?: AbortSignal) =>
  fetch(`${n.url}/chat/completions`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: { 'content-type': 'application/json' },
    ...(signal && { signal }),
  })

describe('simulated node', () => {
  test('every vocabulary word is one token, so streamed text counts exactly', async () => {
    await loadTokenizer()
    expect(vocabulary().length).toBeGreaterThan(100)
    for (const w of vocabulary()) expect(encode(w).length).toBe(1)
  })

  test('streaming with usage: text tokens = completion_tokens, real prompt count', async () => {
    for (const n of [fast, timed]) {
      const s = await client(n).chat.completions.create({
        model: 'm',
        messages,
        stream: true,
        stream_options: { include_usage: true },
      })
      let text = ''
      let usage: OpenAI.CompletionUsage | null | undefined
      for await (const c of s) {
        text += c.choices[0]?.delta.content ?? ''
        usage = c.usage ?? usage
      }
      expect(encode(text).length).toBe(usage!.completion_tokens)
      expect(usage!.prompt_tokens).toBe(encode('<user>\nhello there\n').length)
    }
  })

  test('deterministic for a seed; max_tokens gives length', async () => {
    const a = await client(fast).chat.completions.create({ model: 'm', messages, seed: 7 })
    const b = await client(timed).chat.completions.create({ model: 'm', messages, seed: 7 })
    expect(a.choices[0]!.message.content).toBe(b.choices[0]!.message.content)
    const c = await client(fast).chat.completions.create({ model: 'm', messages, max_tokens: 3 })
    expect(c.choices[0]!.finish_reason).toBe('length')
    expect(c.usage!.completion_tokens).toBe(3)
  })

  test('a repeated long prompt reports cached tokens', async () => {
    const long = [
      { role: 'user' as const, content: 'The quick brown fox jumps over the lazy dog. '.repeat(20) },
    ]
    await client(timed).chat.completions.create({ model: 'm', messages: long, max_tokens: 2 })
    const again = await client(timed).chat.completions.create({ model: 'm', messages: long, max_tokens: 2 })
    expect(again.usage!.prompt_tokens_details!.cached_tokens).toBeGreaterThan(100)
  })

  test('embeddings honour dimensions and base64', async () => {
    const r = await client(fast).embeddings.create({
      model: 'e',
      input: ['a', 'b'],
      dimensions: 16,
      encoding_format: 'float',
    })
    expect(r.data.map((d) => d.embedding.length)).toEqual([16, 16])
    const bad = await fetch(`${fast.url}/embeddings`, {
      method: 'POST',
      body: JSON.stringify({ model: 'e', input: 'a', dimensions: 9999 }),
    })
    expect(bad.status).toBe(400)
  })

  test('faults: 429, 503, 500, a hang until abort, a cut stream', async () => {
    const node = await startSimNode({ name: 'faulty', itlMs: 1, prefillTokensPerSec: 100_000 })
    try {
      const cases: [Partial<SimFaults>, number][] = [
        [{ rate429: 1 }, 429],
        [{ rate503: 1 }, 503],
        [{ errorRate: 1 }, 500],
      ]
      for (const [fault, status] of cases) {
        node.setFaults({ rate429: 0, rate503: 0, errorRate: 0, ...fault })
        const r = await post(node, { model: 'm', messages })
        expect(r.status).toBe(status)
        expect(((await r.json()) as { error: { message: string } }).error.message.length).toBeGreaterThan(0)
      }
      node.setFaults({ rate429: 0, rate503: 0, errorRate: 0, hang: true })
      const ac = new AbortController()
      setTimeout(() => ac.abort(), 100)
      expect(await post(node, { model: 'm', messages }, ac.signal).catch((e) => e.name)).toBe('AbortError')
      node.setFaults({ hang: false, cutAfterTokens: 2 })
      const r = await post(node, { model: 'm', messages, stream: true })
      const text = await r.text().catch(() => 'broken')
      expect(text.includes('[DONE]')).toBe(false)
    } finally {
      await node.stop()
    }
  })

  test('a stall answers nothing and freezes /metrics until cleared, then the stream completes', async () => {
    const node = await startSimNode({ name: 'stalling', itlMs: 1, prefillTokensPerSec: 100_000 })
    const metricsOf = () => fetch(`${node.url.replace('/v1', '')}/metrics`).then((r) => r.text())
    try {
      node.setFaults({ stall: true })
      const frozen = await metricsOf()
      // (Headers may wait for the first chunk, so the first read is raced from the request on.)
      const first = post(node, { model: 'm', messages, stream: true, max_tokens: 3 }).then((r) => {
        const reader = r.body!.getReader()
        return reader.read().then((chunk) => ({ reader, chunk }))
      })
      // Nothing comes while the stall lasts (a request on a live node of this speed takes ~5 ms).
      expect(await Promise.race([first.then(() => 'chunk'), Bun.sleep(300).then(() => 'nothing')])).toBe(
        'nothing',
      )
      expect(await metricsOf()).toBe(frozen)
      expect((await fetch(`${node.url}/models`)).status).toBe(200)
      node.setFaults({ rate429: 0 }) // other faults leave the stall on
      expect(await Promise.race([first.then(() => 'chunk'), Bun.sleep(100).then(() => 'nothing')])).toBe(
        'nothing',
      )
      node.setFaults({ stall: false })
      const { reader, chunk } = await first
      let text = new TextDecoder().decode(chunk.value)
      for (;;) {
        const { done, value } = await reader.read()
        if (done) break
        text += new TextDecoder().decode(value)
      }
      expect(text).toContain('[DONE]')
      expect(await metricsOf()).toMatch(/vllm:num_requests_waiting\{model_name="sim"\} 0/)
    } finally {
      await node.stop()
    }
  })

  test('/metrics shows vLLM metric names; stats count requests and aborts', async () => {
    const m = await (await fetch(`${timed.url.replace('/v1', '')}/metrics`)).text()
    for (const name of [
      'vllm:num_requests_running',
      'vllm:num_requests_waiting',
      'vllm:gpu_cache_usage_perc',
      'vllm:prefix_cache_hits_total',
      'vllm:cache_config_info{block_size="16",num_gpu_blocks="4096"}',
    ])
      expect(m).toContain(name)
    const before = timed.stats()
    const ac = new AbortController()
    const r = await post(timed, { model: 'm', messages, stream: true, max_tokens: 50 }, ac.signal)
    const reader = r.body!.getReader()
    await reader.read()
    ac.abort()
    await Bun.sleep(50)
    expect(timed.stats().aborted).toBe(before.aborted + 1)
    expect(timed.stats().running).toBe(0)
  })
})

describe('simulated node: POST /v1/completions (legacy), as vLLM serves it', () => {
  test('texts, n, echo and logprobs: one choice per prompt and n, usage the node’s counts', async () => {
    for (const n of [fast, timed]) {
      const before = n.stats()
      const prompts = ['hello there', 'a second prompt']
      const c = await client(n).completions.create({
        model: 'm',
        prompt: prompts,
        n: 2,
        max_tokens: 5,
        echo: true,
        logprobs: 1,
        seed: 2,
      })
      expect(c.object).toBe('text_completion')
      expect(c.choices.map((ch) => ch.index)).toEqual([0, 1, 2, 3])
      let generated = 0
      for (const ch of c.choices) {
        const p = prompts[Math.floor(ch.index / 2)]!
        expect(ch.text.startsWith(p)).toBe(true)
        const tokens = ch.logprobs!.tokens!
        expect(tokens.join('')).toBe(ch.text.slice(p.length))
        expect(ch.logprobs!.text_offset![0]).toBe(p.length)
        expect(ch.finish_reason).toBe(tokens.length === 5 ? 'length' : 'stop')
        generated += tokens.length
      }
      const promptTokens = prompts.reduce((s, p) => s + encode(p).length, 0)
      expect(c.usage).toMatchObject({ prompt_tokens: promptTokens, completion_tokens: generated })
      const after = n.stats()
      expect(after.completionRequests - before.completionRequests).toBe(1)
      expect(after.promptTokens - before.promptTokens).toBe(promptTokens)
      expect(after.completionTokens - before.completionTokens).toBe(generated)
    }
  })

  test('streamed: the same text per choice, finish on each choice’s last chunk, a usage chunk, [DONE]', async () => {
    for (const n of [fast, timed]) {
      const body = { model: 'm', prompt: [[1, 2, 3], [4]], n: 2, max_tokens: 6, seed: 5 }
      const plain = await client(n).completions.create(body)
      const s = await client(n).completions.create({
        ...body,
        stream: true,
        stream_options: { include_usage: true },
      })
      const texts = new Map<number, string>()
      const finishes: number[] = []
      let usage: OpenAI.CompletionUsage | undefined
      for await (const c of s) {
        for (const ch of c.choices) {
          texts.set(ch.index, (texts.get(ch.index) ?? '') + ch.text)
          if (ch.finish_reason) finishes.push(ch.index)
        }
        usage = c.usage ?? usage
      }
      for (const ch of plain.choices) expect(texts.get(ch.index)).toBe(ch.text)
      expect(finishes.sort()).toEqual([0, 1, 2, 3])
      expect(usage).toEqual(plain.usage!)
      expect(usage!.prompt_tokens).toBe(4)
    }
  })

  test('refuses what vLLM refuses: best_of under n, a prompt of another shape', async () => {
    for (const body of [
      { model: 'm', prompt: 'x', n: 2, best_of: 1 },
      { model: 'm', prompt: ['x', 1] },
      { model: 'm', prompt: [] },
    ]) {
      const err = await client(fast)
        .completions.create(body as OpenAI.CompletionCreateParamsNonStreaming)
        .catch((e: unknown) => e)
      expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    }
  })
})
