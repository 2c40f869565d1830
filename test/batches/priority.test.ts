import { afterAll, beforeAll, expect, test } from 'bun:test'
import { toFile } from 'openai'
import type { SimNodeOptions } from '../../src/simulator/index.ts'
import { startTropa, type Tropa } from '../helpers/start.ts'

// Batch lines use only the capacity interactive traffic leaves: a line goes to a node only
// while the node has headroom beyond the interactive reserve. Route max_concurrency matches
// each engine's running-sequence cap, as an operator would set it.
const SEQS = 16
const node = (i: number): SimNodeOptions => ({
  name: `sim-${i}`,
  maxSeqs: SEQS,
  prefillTokensPerSec: 20_000,
  itlMs: 4,
  iterationOverheadMs: 1,
  seed: i,
})
let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    nodes: [node(1), node(2)],
    models: (nodes) => [
      {
        id: 'test/chat',
        context_length: 8192,
        pricing: { prompt: '0.000001', completion: '0.000002' },
        routes: nodes.map((n) => ({
          name: n.name,
          base_url: n.url,
          upstream_model: 'm',
          max_concurrency: SEQS,
        })),
      },
    ],
    extra: { batches: { tick_ms: 50, workers: 1, concurrency: 64 } }, // default shares
  })
})
afterAll(() => t.stop())

// An interactive prompt long enough that its prefill dominates its time to first token.
const longPrompt = 'Summarise the following text for a busy reader. '.repeat(40)

/** Closed-loop interactive load: `clients` users each streaming `each` requests; TTFT of every one. */
async function interactiveLoad(clients: number, each: number): Promise<number[]> {
  const ttft: number[] = []
  await Promise.all(
    Array.from({ length: clients }, async (_, c) => {
      for (let i = 0; i < each; i++) {
        const start = performance.now()
        const res = await t.fetch('/v1/chat/completions', {
          method: 'POST',
          body: JSON.stringify({
            model: 'test/chat',
            messages: [{ role: 'user', content: `${longPrompt} (${c}-${i})` }],
            max_tokens: 8,
            stream: true,
          }),
        })
        const reader = res.body!.getReader()
        let first = true
        for (;;) {
          const { done, value } = await reader.read()
          if (done) break
          if (first && new TextDecoder().decode(value).includes('"content":"')) {
            ttft.push(performance.now() - start)
            first = false
          }
        }
      }
    }),
  )
  return ttft
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

test('a 2,000-line batch leaves interactive requests served with their time to first token about unchanged, and still finishes', async () => {
  await interactiveLoad(4, 5) // warm-up: tokenizer, connections
  const alone = median(await interactiveLoad(4, 30))

  const lines = Array.from({ length: 2000 }, (_, i) =>
    JSON.stringify({
      custom_id: `l${i}`,
      method: 'POST',
      url: '/v1/chat/completions',
      body: { model: 'test/chat', messages: [{ role: 'user', content: `short ${i}` }], max_tokens: 8 },
    }),
  )
  const client = t.client()
  const file = await client.files.create({
    file: await toFile(Buffer.from(`${lines.join('\n')}\n`), 'load.jsonl'),
    purpose: 'batch',
  })
  const created = await client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
  })
  let b = await client.batches.retrieve(created.id)
  while (b.status === 'validating' || (b.request_counts?.completed ?? 0) < 100) {
    await Bun.sleep(20)
    b = await client.batches.retrieve(created.id)
  }
  const duringAll = await interactiveLoad(4, 30)
  // Every interactive request got its first token (without the reserve they are refused: no node has room).
  expect(duringAll).toHaveLength(120)
  const during = median(duringAll)
  const doneDuring = (await client.batches.retrieve(created.id)).request_counts?.completed ?? 0
  const batchStart = performance.now()
  while (!['completed', 'failed'].includes(b.status)) {
    await Bun.sleep(50)
    b = await client.batches.retrieve(created.id)
  }
  console.log(
    `interactive median TTFT: ${alone.toFixed(1)} ms alone, ${during.toFixed(1)} ms beside the batch (${((during / alone - 1) * 100).toFixed(1)}%); ` +
      `batch lines done while measuring: ${doneDuring}; batch finished ${((performance.now() - batchStart) / 1000).toFixed(1)} s later`,
  )
  expect(b.status).toBe('completed')
  expect(b.request_counts?.completed).toBe(2000)
  // The batch really ran alongside: 100-116 lines here with batches.quiet_load 0.15 and packing
  // off (the defaults since issue #25's packing work; 410 with packing on), so the floor is 40.
  expect(doneDuring).toBeGreaterThan(40)
  // Typically 0-4% here (logged above), but a median of 7-8 ms moves by tens of percent on a
  // shared 2-core machine (CI runs saw +10% and +44%); how much a batch costs interactive TTFT is
  // measured by bench/batch-yield.ts, not here. What this guards: a batch that took the
  // interactive share shows as refusals (above) or as TTFT several times higher.
  expect(during).toBeLessThanOrEqual(alone * 2)
}, 120_000)
