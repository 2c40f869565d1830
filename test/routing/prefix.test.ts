import { describe, expect, test } from 'bun:test'
import { BLOCK_CHARS, BlockHasher, chainSeed, PrefixIndex } from '../../src/routing/prefix.ts'
import { parseNodeMetrics } from '../../src/routing/probes.ts'

const hash = (model: string, ...pieces: string[]) => {
  const h = new BlockHasher(chainSeed(model))
  for (const p of pieces) h.push(p)
  return h.hashes
}

describe('prefix blocks', () => {
  test('equal prefixes give equal leading hashes; the first differing block and all after differ', () => {
    const base = 'a'.repeat(BLOCK_CHARS * 3)
    const x = hash('m', `${base}${'b'.repeat(BLOCK_CHARS * 2)}`)
    const y = hash('m', `${base}c${'b'.repeat(BLOCK_CHARS * 2 - 1)}`)
    expect(x.length).toBe(5)
    expect(x.slice(0, 3)).toEqual(y.slice(0, 3))
    // Blocks 4 and 5 hold the same text in both prompts after one character; chaining tells them apart.
    expect(x[3]).not.toBe(y[3])
    expect(x[4]).not.toBe(y[4])
  })

  test('how the text is split into pieces does not matter; the model does', () => {
    const text = 'hello world, '.repeat(100)
    expect(hash('m', text)).toEqual(hash('m', text.slice(0, 7), text.slice(7, 300), text.slice(300)))
    expect(hash('m', text)[0]).not.toBe(hash('other', text)[0])
    expect(hash('m', 'short')).toEqual([])
    // Any script, pieces of any size down to one code unit (a block through dozens of pieces).
    const mixed = 'Привет, мир 東京 🙂 hello '.repeat(60)
    const tiny: string[] = []
    for (let i = 0; i < mixed.length; i += 1 + (i % 5)) tiny.push(mixed.slice(i, i + 1 + (i % 5)))
    expect(tiny.join('')).toBe(mixed)
    expect(hash('m', ...tiny)).toEqual(hash('m', mixed))
    expect(hash('m', mixed).length).toBe(Math.floor(mixed.length / BLOCK_CHARS))
    // Texts equal but for how JavaScriptCore stores them (a slice of a two-byte string) hash the same.
    const ascii = 'a plain block of text '.repeat(40)
    expect(hash('m', `Ж${ascii}`.slice(1))).toEqual(hash('m', ascii))
  })

  test('the index matches leading blocks only and forgets the least recently used', () => {
    const idx = new PrefixIndex(6)
    const a = hash('m', 'a'.repeat(BLOCK_CHARS * 4))
    const b = hash('m', 'b'.repeat(BLOCK_CHARS * 4))
    idx.insert(a)
    expect(idx.match(a)).toBe(4)
    expect(idx.match([a[0]!, a[1]!, 12345, a[3]!])).toBe(2)
    expect(idx.match(b)).toBe(0)
    idx.insert(b) // 8 blocks into 6: a's two oldest go
    expect(idx.size).toBe(6)
    expect(idx.match(b)).toBe(4)
    expect(idx.match(a)).toBe(0)
  })
})

describe('node metrics', () => {
  test('reads vLLM and llama.cpp load figures, summed over label sets', () => {
    const vllm = [
      '# HELP vllm:num_requests_waiting Number of requests waiting.',
      '# TYPE vllm:num_requests_waiting gauge',
      'vllm:num_requests_waiting{model_name="a"} 3.0',
      'vllm:num_requests_waiting{model_name="b"} 2.0',
      'vllm:num_requests_running{model_name="a"} 7',
      'vllm:kv_cache_usage_perc{model_name="a"} 0.42',
      'vllm:prompt_tokens_total{model_name="a"} 123456',
    ].join('\n')
    expect(parseNodeMetrics(vllm)).toEqual({ waiting: 5, running: 7, kvUsage: 0.42 })
    const llama =
      'llamacpp:requests_processing 1\nllamacpp:requests_deferred 4\nllamacpp:kv_cache_usage_ratio 0.9\n'
    expect(parseNodeMetrics(llama)).toEqual({ waiting: 4, running: 1, kvUsage: 0.9 })
    expect(parseNodeMetrics('# nothing here\nprocess_cpu_seconds_total 3\n')).toBeUndefined()
  })

  test("reads vLLM's KV-cache size from cache_config_info's labels", () => {
    const page = [
      '# TYPE vllm:cache_config_info gauge',
      'vllm:cache_config_info{block_size="16",cache_dtype="auto",gpu_memory_utilization="0.9",num_cpu_blocks="2048",num_gpu_blocks="27162",prefix_caching_hash_algo="builtin"} 1.0',
      'vllm:num_requests_running{model_name="a"} 2',
    ].join('\n')
    expect(parseNodeMetrics(page)).toEqual({
      waiting: 0,
      running: 2,
      kvUsage: undefined,
      cacheBlocks: 27_162,
    })
    // The label first, or missing or empty: no size.
    expect(
      parseNodeMetrics('vllm:cache_config_info{num_gpu_blocks="512"} 1\nvllm:num_requests_waiting 1'),
    ).toEqual({
      waiting: 1,
      running: 0,
      kvUsage: undefined,
      cacheBlocks: 512,
    })
    expect(
      parseNodeMetrics('vllm:cache_config_info{num_gpu_blocks=""} 1\nvllm:num_requests_waiting 1'),
    ).toEqual({
      waiting: 1,
      running: 0,
      kvUsage: undefined,
    })
    expect(
      parseNodeMetrics('vllm:cache_config_info{block_size="16"} 1\nvllm:num_requests_waiting 1'),
    ).toEqual({
      waiting: 1,
      running: 0,
      kvUsage: undefined,
    })
    // One line per engine (data parallel): their sum. An override printed as None is no size.
    expect(
      parseNodeMetrics(
        [
          'vllm:cache_config_info{engine="0",num_gpu_blocks="1000",num_gpu_blocks_override="None"} 1.0',
          'vllm:cache_config_info{engine="1",num_gpu_blocks="1000",num_gpu_blocks_override="None"} 1.0',
          'vllm:cache_config_info{num_gpu_blocks="None"} 1.0',
          'vllm:num_requests_running{engine="0"} 1',
        ].join('\n'),
      ),
    ).toEqual({ waiting: 0, running: 1, kvUsage: undefined, cacheBlocks: 2_000 })
    // A cache size alone is no load figure.
    expect(parseNodeMetrics('vllm:cache_config_info{num_gpu_blocks="512"} 1\n')).toBeUndefined()
  })
})
