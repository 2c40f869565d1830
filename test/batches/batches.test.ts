import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI, { toFile } from 'openai'
import { rubNumberToNano } from '../../src/billing/money.ts'
import { startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa
let client: OpenAI
beforeAll(async () => {
  t = await startTropa()
  client = t.client()
})
afterAll(() => t.stop())

const jsonl = (rows: unknown[]) => `${rows.map((r) => JSON.stringify(r)).join('\n')}\n`
const chatLine = (i: number) => ({
  custom_id: `req-${i}`,
  method: 'POST',
  url: '/v1/chat/completions',
  body: {
    model: 'test/chat',
    messages: [{ role: 'user', content: `question number ${i}` }],
    max_tokens: 12,
    seed: i,
  },
})

async function waitFor(id: string, done = ['completed', 'failed', 'expired', 'cancelled'], ms = 20_000) {
  const until = Date.now() + ms
  for (;;) {
    const b = await client.batches.retrieve(id)
    if (done.includes(b.status)) return b
    if (Date.now() > until) throw new Error(`batch ${id} stuck in ${b.status}`)
    await Bun.sleep(50)
  }
}

async function ledgerOf(batchId: string | null) {
  await t.svc.ledger.flush()
  return (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
    (r) => r.kind === 'usage' && r.batchId === batchId,
  )
}

describe('batches through the official SDK', () => {
  test('a 200-line chat batch: every custom_id answered once, at exactly half the live price', async () => {
    const t0 = performance.now()
    const rows = Array.from({ length: 200 }, (_, i) => chatLine(i))
    const file = await client.files.create({
      file: await toFile(Buffer.from(jsonl(rows)), 'chat.jsonl'),
      purpose: 'batch',
    })
    expect(file).toMatchObject({ object: 'file', purpose: 'batch', filename: 'chat.jsonl' })
    const created = await client.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
      metadata: { run: 'ci' },
    })
    expect(created.status).toBe('validating')
    const b = await waitFor(created.id)
    expect(b.status).toBe('completed')
    expect(b.request_counts).toEqual({ total: 200, completed: 200, failed: 0 })
    expect(b.metadata).toEqual({ run: 'ci' })
    for (const stamp of ['in_progress_at', 'finalizing_at', 'completed_at'] as const)
      expect(b[stamp]).toBeGreaterThan(0)
    expect(b.finalizing_at!).toBeGreaterThanOrEqual(b.in_progress_at!)
    expect(b.completed_at!).toBeGreaterThanOrEqual(b.finalizing_at!)
    const text = await (await client.files.content(b.output_file_id!)).text()
    const out = text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
    expect(out.map((o) => o.custom_id).sort()).toEqual(rows.map((r) => r.custom_id).sort())
    for (const o of out) {
      expect(o.error).toBeNull()
      expect(o.response.status_code).toBe(200)
      expect(o.response.body.object).toBe('chat.completion')
      expect(o.response.body.model).toBe('test/chat')
    }

    // The same requests live, for the price comparison: seeds make the answers identical.
    for (const r of rows.slice(0, 20))
      await client.chat.completions.create(r.body as OpenAI.ChatCompletionCreateParamsNonStreaming)
    const live = await ledgerOf(null)
    const batched = await ledgerOf(b.id)
    expect(batched).toHaveLength(200)
    for (const l of live.slice(-20)) {
      const twin = batched.find(
        (x) => x.promptTokens === l.promptTokens && x.completionTokens === l.completionTokens,
      )!
      expect(twin.costNano * 2n).toBe(l.costNano)
    }
    const sum = batched.reduce((s, r) => s + r.costNano, 0n)
    expect(rubNumberToNano((b as unknown as { cost_rub: number }).cost_rub)).toBe(sum)
    console.log(`200-line chat batch end to end: ${(performance.now() - t0).toFixed(0)} ms`)
  }, 30_000)

  test('a 100-line embeddings batch', async () => {
    const rows = Array.from({ length: 100 }, (_, i) => ({
      custom_id: `e${i}`,
      method: 'POST',
      url: '/v1/embeddings',
      body: { model: 'test/embed', input: `text ${i}`, dimensions: 8 },
    }))
    const file = await client.files.create({
      file: await toFile(Buffer.from(jsonl(rows)), 'emb.jsonl'),
      purpose: 'batch',
    })
    const b = await waitFor(
      (
        await client.batches.create({
          input_file_id: file.id,
          endpoint: '/v1/embeddings',
          completion_window: '24h',
        })
      ).id,
    )
    expect(b.request_counts).toEqual({ total: 100, completed: 100, failed: 0 })
    const out = (await (await client.files.content(b.output_file_id!)).text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
    expect(out).toHaveLength(100)
    expect(out[0].response.body.data[0].embedding).toHaveLength(8)
    expect(await ledgerOf(b.id)).toHaveLength(100)
  })

  test('validation: bad lines fail the batch with line numbers and codes, nothing runs or is billed', async () => {
    const lines = [
      JSON.stringify(chatLine(1)),
      '{"custom_id": "broken", ',
      JSON.stringify(chatLine(1)),
      JSON.stringify({ ...chatLine(3), url: '/v1/embeddings' }),
      JSON.stringify({
        ...chatLine(4),
        body: { model: 'nope/none', messages: [{ role: 'user', content: 'x' }] },
      }),
      JSON.stringify({ ...chatLine(5), method: 'GET' }),
      JSON.stringify({ ...chatLine(6), body: { ...chatLine(6).body, temperature: 3 } }),
    ]
    const file = await client.files.create({
      file: await toFile(Buffer.from(`${lines.join('\n')}\n`), 'bad.jsonl'),
      purpose: 'batch',
    })
    const before = t.nodes.reduce((s, n) => s + n.stats().chatRequests, 0)
    const b = await waitFor(
      (
        await client.batches.create({
          input_file_id: file.id,
          endpoint: '/v1/chat/completions',
          completion_window: '24h',
        })
      ).id,
    )
    expect(b.status).toBe('failed')
    const errors = (b.errors?.data ?? []).map((e) => [e.line, e.code])
    expect(errors).toEqual([
      [2, 'invalid_json_line'],
      [3, 'duplicate_custom_id'],
      [4, 'invalid_url'],
      [5, 'model_not_found'],
      [6, 'invalid_method'],
      [7, 'invalid_body'],
    ])
    // A bad body reads as the live endpoint's 400 would: OpenAI's param notation, a plain message.
    const bad = b.errors!.data!.find((e) => e.line === 7)!
    expect(bad.param).toBe('body.temperature')
    expect(bad.message).toMatch(/^body\.temperature: .*2/)
    expect(t.nodes.reduce((s, n) => s + n.stats().chatRequests, 0)).toBe(before)
    expect(await ledgerOf(b.id)).toHaveLength(0)
  })

  test("a batch whose worst case exceeds the key's remaining limit fails before running", async () => {
    const res = await t.fetch('/v1/keys', {
      method: 'POST',
      key: t.masterKey,
      body: JSON.stringify({ name: 'small', limit_rub: 0.001 }),
    })
    const small = (await res.json()) as { key: string }
    const c = t.client(small.key)
    const file = await c.files.create({
      file: await toFile(Buffer.from(jsonl([chatLine(1), chatLine(2)])), 'x.jsonl'),
      purpose: 'batch',
    })
    const created = await c.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    })
    let b = await c.batches.retrieve(created.id)
    for (let i = 0; i < 200 && b.status === 'validating'; i++) {
      await Bun.sleep(25)
      b = await c.batches.retrieve(created.id)
    }
    expect(b.status).toBe('failed')
    expect(b.errors?.data?.[0]?.code).toBe('key_limit_reached')
  })

  test("another org's batch and file are 404; signed links: valid, tampered, expired", async () => {
    const list = await client.batches.list()
    const b = list.data.find((x) => x.status === 'completed')!
    const other = await t.admin('/v1/admin/organizations', { name: 'intruder', balance_rub: 1 })
    const mk = ((await other.json()) as { master_key: string }).master_key
    const k = (await (
      await t.fetch('/v1/keys', { method: 'POST', key: mk, body: '{"name":"i"}' })
    ).json()) as { key: string }
    expect((await t.fetch(`/v1/batches/${b.id}`, { key: k.key })).status).toBe(404)
    expect((await t.fetch(`/v1/files/${b.output_file_id}`, { key: k.key })).status).toBe(404)
    expect((await t.fetch(`/v1/files/${b.output_file_id}/content`, { key: k.key })).status).toBe(404)

    const url = (b as unknown as { output_file_url: string }).output_file_url
    const ok = await fetch(url)
    expect(ok.status).toBe(200)
    expect((await ok.text()).split('\n').length).toBeGreaterThan(1)
    const tampered = url.replace(/signature=(.)/, (_m, c: string) => `signature=${c === '0' ? '1' : '0'}`)
    expect((await fetch(tampered)).status).toBe(403)
    const u = new URL(url)
    const past = Math.floor(Date.now() / 1000) - 10
    const expired = `${u.origin}${u.pathname}?expires=${past}&signature=${t.svc.batches.signer.sign(b.output_file_id!, past)}`
    expect((await fetch(expired)).status).toBe(403)
  })

  test('a forged Host header does not change signed links: they start at the listen address', async () => {
    const b = (await client.batches.list()).data.find((x) => x.status === 'completed')!
    const forged = { host: 'evil.example', 'x-forwarded-host': 'evil.example' }
    const one = (await (await t.fetch(`/v1/batches/${b.id}`, { headers: forged })).json()) as {
      output_file_url: string
    }
    const list = (await (await t.fetch('/v1/batches', { headers: forged })).json()) as {
      data: { output_file_url: string | null }[]
    }
    const links = [one.output_file_url, ...list.data.map((x) => x.output_file_url).filter((u) => u !== null)]
    expect(links.length).toBeGreaterThan(1)
    for (const link of links) {
      expect(link).not.toContain('evil.example')
      expect(link.startsWith(`${t.url}/v1/files/`)).toBe(true)
    }
    expect((await fetch(one.output_file_url)).status).toBe(200)
  })

  test('files: list, get, delete; multipart inline batch creation', async () => {
    const form = new FormData()
    form.set('endpoint', '/v1/chat/completions')
    form.set('completion_window', '24h')
    form.set('file', new Blob([jsonl([chatLine(1), chatLine(2)])]), 'inline.jsonl')
    const res = await t.fetch('/v1/batches', {
      method: 'POST',
      body: form,
      headers: { authorization: `Bearer ${t.apiKey}` },
    })
    expect(res.status).toBe(200)
    const created = (await res.json()) as { id: string; input_file_id: string }
    const b = await waitFor(created.id)
    expect(b.request_counts?.completed).toBe(2)
    const files = await client.files.list()
    expect(files.data.some((f) => f.id === created.input_file_id)).toBe(true)
    const del = await client.files.delete(created.input_file_id)
    expect(del.deleted).toBe(true)
    const err = await client.files.retrieve(created.input_file_id).catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.NotFoundError)
  })
})
