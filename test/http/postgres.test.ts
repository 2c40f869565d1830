import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI, { toFile } from 'openai'
import { rubNumberToNano } from '../../src/billing/money.ts'
import { newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

// The same router on storage.kind = "postgres": requests, keys, billing and a batch, against
// the machine's real PostgreSQL, in a database of this file's own.
let t: Tropa
beforeAll(async () => {
  t = await startTropa({ postgres: true })
})
afterAll(() => t.stop())

describe('on PostgreSQL', () => {
  test('chat, revocation and the ledger', async () => {
    const k = await newApiKey(t, { name: 'pg', limit_rub: 1 })
    const c = t.client(k.key)
    const r = await c.chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 5,
    })
    expect(r.choices).toHaveLength(1)
    await t.svc.ledger.flush()
    const rec = (await (await t.fetch(`/v1/keys/${k.key_id}`, { key: t.masterKey })).json()) as {
      spent_rub: number
    }
    const rows = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
      (x) => x.keyId === k.key_id,
    )
    expect(rows).toHaveLength(1)
    expect(rubNumberToNano(rec.spent_rub)).toBe(rows[0]!.costNano)
    await t.fetch(`/v1/keys/${k.key_id}`, { method: 'DELETE', key: t.masterKey })
    expect(
      await c.chat.completions
        .create({ model: 'test/chat', messages: [{ role: 'user', content: 'x' }] })
        .catch((e) => e),
    ).toBeInstanceOf(OpenAI.AuthenticationError)
  })

  test('concurrent credits cannot take a balance past one billion roubles (the write awaits PostgreSQL)', async () => {
    const res = await t.admin('/v1/admin/organizations', { name: 'credit-race', balance_rub: 0 })
    const { id } = (await res.json()) as { id: string }
    const answers = await Promise.all(
      Array.from({ length: 12 }, () =>
        t.admin(`/v1/admin/organizations/${id}/credit`, { amount_rub: 200_000_000 }),
      ),
    )
    expect(answers.filter((a) => a.status === 200)).toHaveLength(5)
    expect(answers.filter((a) => a.status === 400)).toHaveLength(7)
    const stored = (await t.svc.store.loadOrgs()).find((o) => o.id === id)
    expect(stored?.balanceNano).toBe(1_000_000_000n * 1_000_000_000n)
  })

  test('a batch runs through worker threads that open PostgreSQL themselves', async () => {
    const client = t.client()
    const lines = Array.from({ length: 20 }, (_, i) =>
      JSON.stringify({
        custom_id: `p${i}`,
        method: 'POST',
        url: '/v1/chat/completions',
        body: { model: 'test/chat', messages: [{ role: 'user', content: `p${i}` }], max_tokens: 4 },
      }),
    )
    const file = await client.files.create({
      file: await toFile(Buffer.from(`${lines.join('\n')}\n`), 'pg.jsonl'),
      purpose: 'batch',
    })
    let b = await client.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    })
    for (let i = 0; i < 1200 && !['completed', 'failed'].includes(b.status); i++) {
      await Bun.sleep(25)
      b = await client.batches.retrieve(b.id)
    }
    expect(b.status).toBe('completed')
    expect(b.request_counts).toEqual({ total: 20, completed: 20, failed: 0 })
  }, 45_000)
})
