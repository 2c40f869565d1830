import { afterEach, expect, test } from 'bun:test'
import OpenAI, { toFile } from 'openai'
import { rubNumberToNano } from '../../src/billing/money.ts'
import { CHAT_PRICE, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const line = (i: number) =>
  JSON.stringify({
    custom_id: `m${i}`,
    method: 'POST',
    url: '/v1/chat/completions',
    body: { model: 'test/chat', messages: [{ role: 'user', content: `m${i}` }], max_tokens: 20 },
  })

test('file limits: too large -> 413, too many lines -> 400, both before anything is stored', async () => {
  t = await startTropa({ extra: { files: { max_bytes: 2000, max_lines: 5 } } })
  const client = t.client()
  const big = await client.files
    .create({ file: await toFile(Buffer.from('x'.repeat(5000)), 'big.jsonl'), purpose: 'batch' })
    .catch((e) => e)
  expect(big.status).toBe(413)
  expect(big.code).toBe('payload_too_large')
  const many = await client.files
    .create({ file: await toFile(Buffer.from('{}\n'.repeat(6)), 'many.jsonl'), purpose: 'batch' })
    .catch((e) => e)
  expect(many).toBeInstanceOf(OpenAI.BadRequestError)
  const wrongPurpose = await client.files
    .create({ file: await toFile(Buffer.from('{}\n'), 'p.jsonl'), purpose: 'fine-tune' })
    .catch((e) => e)
  expect(wrongPurpose).toBeInstanceOf(OpenAI.BadRequestError)
  expect((await client.files.list()).data).toHaveLength(0)
})

test('money running out mid-batch: the batch fails, finished lines are kept, the balance never goes negative', async () => {
  t = await startTropa({
    nodes: [
      { name: 'slow', itlMs: 10, prefillTokensPerSec: 100_000 },
      { name: 'hanger', faults: { hang: true } },
    ],
    // test/chat runs the batch; test/hang holds a live request (and its reservation) open.
    models: ([slow, hanger]) => [
      {
        id: 'test/chat',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: [{ name: 'slow', base_url: slow!.url }],
      },
      {
        id: 'test/hang',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: [{ name: 'hanger', base_url: hanger!.url }],
      },
    ],
    upstream: { first_byte_timeout_ms: 30_000 },
    balanceRub: 0.2,
    extra: { batches: { tick_ms: 50, workers: 1, concurrency: 2 } },
  })
  const client = t.client()
  const N = 40
  const file = await client.files.create({
    file: await toFile(
      Buffer.from(`${Array.from({ length: N }, (_, i) => line(i)).join('\n')}\n`),
      'm.jsonl',
    ),
    purpose: 'batch',
  })
  const created = await client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
  })
  let b = await client.batches.retrieve(created.id)
  while (b.status === 'validating') b = await client.batches.retrieve(created.id)
  expect(b.status).toBe('in_progress')
  // Another key's live request holds most of the balance (its worst case stays reserved while
  // it waits on a node that never answers): the batch's next lines cannot be covered.
  const spender = (await newApiKey(t, { name: 'spender' })).key
  const hold = new AbortController()
  const held = t
    .fetch('/v1/chat/completions', {
      method: 'POST',
      key: spender,
      signal: hold.signal,
      body: JSON.stringify({
        model: 'test/hang',
        messages: [{ role: 'user', content: 'hold' }],
        max_tokens: 3100,
      }),
    })
    .catch(() => undefined)
  while (!['failed', 'completed'].includes(b.status)) {
    await Bun.sleep(20)
    b = await client.batches.retrieve(created.id)
  }
  hold.abort()
  await held
  expect(b.status).toBe('failed')
  expect((b.errors?.data ?? []).map((e) => e.code)).toContain('insufficient_quota')
  const ok = b.output_file_id
    ? (await (await client.files.content(b.output_file_id)).text()).trim().split('\n')
    : []
  const bad = (await (await client.files.content(b.error_file_id!)).text()).trim().split('\n')
  expect(ok.length).toBe(b.request_counts?.completed ?? -1)
  expect(ok.length + bad.length).toBe(N)
  await t.svc.ledger.flush()
  const org = (await (await t.fetch('/v1/organization', { key: t.masterKey })).json()) as {
    balance_rub: number
  }
  expect(rubNumberToNano(org.balance_rub)).toBeGreaterThanOrEqual(0n)
}, 60_000)
