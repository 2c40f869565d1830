// Batch throughput on an otherwise idle fleet versus the same requests sent live at full
// concurrency, in one run: how much of the idle capacity a batch uses.
//   bun bench/batch-throughput.ts [--lines 800] [--json]
import { parseArgs } from 'node:util'
import { toFile } from 'openai'
import type { SimNodeOptions } from '../src/simulator/index.ts'
import { startTropa } from '../test/helpers/start.ts'

const { values } = parseArgs({ options: { lines: { type: 'string' }, json: { type: 'boolean' } } })
const N = Number(values.lines ?? 800)
const SEQS = 16
const node = (i: number): SimNodeOptions => ({
  name: `sim-${i}`,
  maxSeqs: SEQS,
  itlMs: 5,
  prefillTokensPerSec: 20_000,
  seed: i,
})

const t = await startTropa({
  nodes: [node(1), node(2)],
  models: (nodes) => [
    {
      id: 'bench/chat',
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
  extra: { batches: { tick_ms: 20, workers: 1, concurrency: 128 } },
})
const body = (i: number) => ({
  model: 'bench/chat',
  messages: [{ role: 'user' as const, content: `request ${i}` }],
  max_tokens: 32,
  seed: i,
})

try {
  // Live: the fleet's whole capacity (2 nodes x 16 sequences) kept busy by a closed loop.
  const client = t.client()
  await Promise.all(Array.from({ length: 8 }, (_, i) => client.chat.completions.create(body(i)))) // warm-up
  let next = 0
  const liveStart = performance.now()
  await Promise.all(
    Array.from({ length: 2 * SEQS }, async () => {
      while (next < N) await client.chat.completions.create(body(next++))
    }),
  )
  const liveSec = (performance.now() - liveStart) / 1000

  // Batch: the same requests as one batch on the now idle fleet.
  const jsonl = Array.from({ length: N }, (_, i) =>
    JSON.stringify({ custom_id: `b${i}`, method: 'POST', url: '/v1/chat/completions', body: body(i) }),
  ).join('\n')
  const file = await client.files.create({
    file: await toFile(Buffer.from(`${jsonl}\n`), 'bench.jsonl'),
    purpose: 'batch',
  })
  await Bun.sleep(2100) // let the nodes count as free of interactive traffic
  let b = await client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
  })
  while (b.status === 'validating') {
    await Bun.sleep(5)
    b = await client.batches.retrieve(b.id)
  }
  const batchStart = performance.now()
  while (b.status === 'in_progress' || b.status === 'finalizing') {
    await Bun.sleep(10)
    b = await client.batches.retrieve(b.id)
  }
  const batchSec = (performance.now() - batchStart) / 1000
  const summary = {
    lines: N,
    live_lines_per_sec: +(N / liveSec).toFixed(1),
    batch_lines_per_sec: +(N / batchSec).toFixed(1),
    batch_share_of_live: +(liveSec / batchSec).toFixed(3),
    batch_status: b.status,
  }
  if (values.json) console.log(JSON.stringify(summary))
  else console.table(summary)
} finally {
  await t.stop()
}
