import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from 'bun:test'
import OpenAI from 'openai'
import { formatRub, rubNumberToNano } from '../../src/billing/money.ts'
import type { LedgerEntry } from '../../src/storage/store.ts'
import { startTropa, type Tropa } from '../helpers/start.ts'

setDefaultTimeout(30_000)

// GET /v1/activity and GET /v1/usage/series over real HTTP, on SQLite and on PostgreSQL: the rows
// that requests made through the openai SDK leave, read back with fetch.

interface Row {
  request_id: string
  created_at: number
  kind: string
  key_id: string | null
  key_name: string | null
  model: string | null
  node: string | null
  outcome: string
  prompt_tokens: number
  completion_tokens: number
  cached_tokens: number | null
  cost_rub: number
  started_at_ms: number
  ended_at_ms: number
  duration_ms: number
  ttft_ms: number | null
}
interface Page {
  object: string
  data: Row[]
  has_more: boolean
  first_id: string | null
  last_id: string | null
}

/** RFC 4180: quoted fields may hold commas, doubled quotes, CR and LF. */
function parseCsv(text: string): string[][] {
  const records: string[][] = []
  let record: string[] = []
  let field = ''
  let quoted = false
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') {
        field += '"'
        i++
      } else if (c === '"') quoted = false
      else field += c
    } else if (c === '"') quoted = true
    else if (c === ',') {
      record.push(field)
      field = ''
    } else if (c === '\r' && text[i + 1] === '\n') {
      record.push(field)
      records.push(record)
      record = []
      field = ''
      i++
    } else field += c
  }
  if (field !== '' || record.length > 0) throw new Error('the CSV does not end with CRLF')
  return records
}

const ledgerRow = (over: Partial<LedgerEntry> & { requestId: string; orgId: string }): LedgerEntry => ({
  kind: 'usage',
  keyId: null,
  model: 'test/chat',
  node: 'sim-1',
  promptTokens: 10,
  completionTokens: 5,
  costNano: 1_000n,
  batchId: null,
  startedAtMs: 1_700_000_000_000,
  endedAtMs: 1_700_000_000_100,
  outcome: 'ok',
  estimated: false,
  ...over,
})

for (const postgres of [false, true]) {
  describe(`activity and usage series (${postgres ? 'PostgreSQL' : 'SQLite'})`, () => {
    let t: Tropa
    let other: { orgId: string; master: string; apiKey: string }
    let second: { id: string; key: string }
    const asMaster = (path: string) => t.fetch(path, { key: t.masterKey })
    const page = async (path: string, key = t.masterKey): Promise<Page> => {
      const r = await t.fetch(path, { key })
      expect(r.status).toBe(200)
      return (await r.json()) as Page
    }
    const myKeyId = async () =>
      ((await (await asMaster('/v1/keys')).json()) as { data: { key_id: string; name: string }[] }).data.find(
        (k) => k.name === 'test',
      )!.key_id

    beforeAll(async () => {
      // One node: a repeated prompt meets its own prefix cache, so cached tokens are reported.
      t = await startTropa({ postgres, nodes: [{ name: 'sim-1', timeScale: 0, seed: 1 }] })
      const created = (await (
        await t.fetch('/v1/keys', {
          key: t.masterKey,
          method: 'POST',
          body: JSON.stringify({ name: 'second, "quoted"\nkey' }),
        })
      ).json()) as { key_id: string; key: string }
      second = { id: created.key_id, key: created.key }
      const org = (await (
        await t.admin('/v1/admin/organizations', { name: 'other-org', balance_rub: 100 })
      ).json()) as { id: string; master_key: string }
      const key = (await (
        await t.fetch('/v1/keys', {
          key: org.master_key,
          method: 'POST',
          body: JSON.stringify({ name: 'b' }),
        })
      ).json()) as { key: string }
      other = { orgId: org.id, master: org.master_key, apiKey: key.key }
    })
    afterAll(() => t.stop())

    test('each request is a row: exact cost as charged, cached tokens and TTFT for chat, newest first', async () => {
      const prompt = `${'the same long system prompt shared by both requests '.repeat(12)}`
      const messages = [
        { role: 'system' as const, content: prompt },
        { role: 'user' as const, content: 'hello' },
      ]
      const client = t.client()
      const costs = new Map<string, string>()
      const first = await client.chat.completions
        .create({ model: 'test/chat', messages, max_tokens: 8 })
        .withResponse()
      costs.set(first.response.headers.get('x-request-id')!, first.response.headers.get('x-tropa-cost-rub')!)
      const streamed = await client.chat.completions
        .create({ model: 'test/chat', messages, max_tokens: 8, stream: true })
        .withResponse()
      for await (const _ of streamed.data) {
        // read to the end
      }
      costs.set(streamed.response.headers.get('x-request-id')!, '')
      const emb = await client.embeddings.create({ model: 'test/embed', input: 'abc' }).withResponse()
      costs.set(emb.response.headers.get('x-request-id')!, emb.response.headers.get('x-tropa-cost-rub')!)

      const list = await page('/v1/activity?limit=10')
      expect(list.object).toBe('list')
      expect(list.data).toHaveLength(3)
      expect(list.has_more).toBe(false)
      // Newest first.
      const ends = list.data.map((r) => r.ended_at_ms)
      expect([...ends].sort((a, b) => b - a)).toEqual(ends)
      expect(list.data.map((r) => r.model)).toEqual(['test/embed', 'test/chat', 'test/chat'])
      const ledger = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
        (e) => e.kind === 'usage',
      )
      expect(ledger).toHaveLength(3)
      for (const row of list.data) {
        const entry = ledger.find((e) => e.requestId === row.request_id)!
        expect(rubNumberToNano(row.cost_rub)).toBe(entry.costNano)
        expect(row.key_name).toBe('test')
        expect(row.duration_ms).toBe(row.ended_at_ms - row.started_at_ms)
        expect(row.ttft_ms).not.toBeNull()
        expect(row.ttft_ms!).toBeGreaterThanOrEqual(0)
        expect(row.ttft_ms!).toBeLessThanOrEqual(row.duration_ms)
      }
      // The x-request-id of a response is the chat's own; its row carries the charged cost.
      const json = list.data[2]!
      expect(formatRub(rubNumberToNano(json.cost_rub)!)).toBe(
        costs.get(first.response.headers.get('x-request-id')!)!,
      )
      expect(json.cached_tokens).toBe(0)
      // The stream repeated the prompt: the simulator served its prefix from cache.
      const stream = list.data[1]!
      expect(stream.cached_tokens!).toBeGreaterThan(0)
      expect(stream.cached_tokens).toBe(
        ledger.find((e) => e.requestId === stream.request_id)!.cachedTokens as number,
      )
      // Embeddings report no cache.
      expect(list.data[0]!.cached_tokens).toBeNull()
    })

    test('filters: key, model, outcome, time range; credits only with include_credits', async () => {
      await t.client(second.key).chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'from the second key' }],
        max_tokens: 4,
      })
      await t.admin(`/v1/admin/organizations/${t.orgId}/credit`, { amount_rub: 5 })
      const all = await page('/v1/activity')
      expect(all.data.every((r) => r.kind === 'usage')).toBe(true)
      const byKey = await page(`/v1/activity?key_id=${second.id}`)
      expect(byKey.data.map((r) => r.key_id)).toEqual([second.id])
      expect(byKey.data[0]!.key_name).toBe('second, "quoted"\nkey')
      const byModel = await page('/v1/activity?model=test/embed')
      expect(byModel.data.map((r) => r.model)).toEqual(['test/embed'])
      expect((await page('/v1/activity?outcome=ok')).data).toHaveLength(all.data.length)
      expect((await page('/v1/activity?outcome=client_disconnected')).data).toHaveLength(0)
      const newest = all.data[0]!
      const range = await page(`/v1/activity?from=${newest.created_at}&to=${newest.created_at + 1}`)
      expect(range.data.map((r) => r.request_id)).toContain(newest.request_id)
      expect(
        (await page(`/v1/activity?to=${Math.floor(all.data.at(-1)!.ended_at_ms / 1000)}`)).data,
      ).toHaveLength(0)
      const withCredits = await page('/v1/activity?include_credits=true')
      const credits = withCredits.data.filter((r) => r.kind === 'credit')
      const creditRows = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
        (e) => e.kind === 'credit',
      )
      expect(credits.map((r) => r.request_id).sort()).toEqual(creditRows.map((e) => e.requestId).sort())
      expect(credits.some((r) => r.cost_rub === 5)).toBe(true)
      for (const [q, param] of [
        ['limit=0', 'limit'],
        ['limit=1001', 'limit'],
        ['from=10&to=5', 'from'],
        ['format=xml', 'format'],
        ['after=nope', 'after'],
        ['format=csv&limit=5', 'limit'],
      ] as const) {
        const r = await asMaster(`/v1/activity?${q}`)
        expect(r.status).toBe(400)
        expect(((await r.json()) as { error: { param: string } }).error.param).toBe(param)
      }
    })

    test('an operator debits with a reason; the ledger keeps it beside the row', async () => {
      const org = (await (
        await t.admin('/v1/admin/organizations', { name: `debit-${Date.now()}`, balance_rub: 100 })
      ).json()) as { id: string; master_key: string }
      const base = `/v1/admin/organizations/${org.id}`
      // A debit must say why; it cannot take more than the balance.
      const noReason = await t.admin(`${base}/debit`, { amount_rub: 1 })
      expect(noReason.status).toBe(400)
      const tooMuch = await t.admin(`${base}/debit`, { amount_rub: 100.5, reason: 'too much' })
      expect(tooMuch.status).toBe(409)
      expect(((await tooMuch.json()) as { error: { code: string } }).error.code).toBe('insufficient_balance')
      const reason = 'refund of double charge, ticket #42, "quoted", comma'
      const debited = await t.admin(`${base}/debit`, { amount_rub: 30.25, reason })
      expect(debited.status).toBe(200)
      expect(((await debited.json()) as { balance_rub: number }).balance_rub).toBe(69.75)
      const credited = await t.admin(`${base}/credit`, { amount_rub: 5, reason: 'goodwill' })
      expect(((await credited.json()) as { balance_rub: number }).balance_rub).toBe(74.75)
      await t.admin(`${base}/credit`, { amount_rub: 1 })
      // The organization sees them with include_credits, reasons and signs as given (rows of one
      // millisecond order by request id, so compare them sorted by amount).
      const r = await t.fetch('/v1/activity?include_credits=true', { key: org.master_key })
      const rows = ((await r.json()) as { data: (Row & { reason: string | null })[] }).data
      expect(
        rows.map((x) => [x.kind, x.cost_rub, x.reason]).sort((a, b) => Number(a[1]) - Number(b[1])),
      ).toEqual([
        ['credit', -30.25, reason],
        ['credit', 1, null],
        ['credit', 5, 'goodwill'],
        ['credit', 100, null],
      ])
      // The store's balance is the sum of its ledger rows.
      const ledger = await t.svc.store.ledgerForOrg(org.id, 0, Date.now() + 1000)
      expect(ledger.find((e) => e.costNano < 0n)?.reason).toBe(reason)
      const stored = await t.svc.store.getOrg(org.id)
      expect(stored?.balanceNano).toBe(ledger.reduce((a, e) => a + e.costNano, 0n))
      // The CSV export carries the reason in its own column.
      const csv = parseCsv(
        await (await t.fetch('/v1/activity?format=csv&include_credits=true', { key: org.master_key })).text(),
      )
      const [header, ...body] = csv
      const debitRow = body.find((rec) => rec[header!.indexOf('cost_rub')]!.startsWith('-'))!
      expect(debitRow[header!.indexOf('reason')]).toBe(reason)
    })

    test('who sees what: the master key its org, an API key its own rows, the admin with org_id', async () => {
      await new OpenAI({ baseURL: t.baseURL, apiKey: other.apiKey, maxRetries: 0 }).chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'another organization' }],
        max_tokens: 4,
      })
      const mine = await page('/v1/activity?limit=1000')
      const theirs = await page('/v1/activity', other.master)
      expect(theirs.data).toHaveLength(1)
      expect(mine.data.map((r) => r.request_id)).not.toContain(theirs.data[0]!.request_id)
      // An API key: only its own key's rows, whatever it asks.
      const own = await myKeyId()
      const asKey = await page('/v1/activity?limit=1000', t.apiKey)
      expect(asKey.data.length).toBeGreaterThan(0)
      expect(asKey.data.every((r) => r.key_id === own)).toBe(true)
      expect(asKey.data.length).toBe(mine.data.filter((r) => r.key_id === own).length)
      expect((await t.fetch(`/v1/activity?key_id=${second.id}`)).status).toBe(403)
      expect((await t.fetch(`/v1/activity?org_id=${other.orgId}`)).status).toBe(400)
      // Another key's row (or organization's) is no cursor for it.
      const secondsRow = mine.data.find((r) => r.key_id === second.id)!
      expect((await t.fetch(`/v1/activity?after=${secondsRow.request_id}`)).status).toBe(400)
      expect((await asMaster(`/v1/activity?after=${theirs.data[0]!.request_id}`)).status).toBe(400)
      // A master key cannot name another organization; the admin must name one.
      expect((await asMaster(`/v1/activity?org_id=${other.orgId}`)).status).toBe(400)
      expect((await t.admin('/v1/activity')).status).toBe(400)
      const admin = (await (await t.admin(`/v1/activity?org_id=${other.orgId}`)).json()) as Page
      expect(admin.data.map((r) => r.request_id)).toEqual(theirs.data.map((r) => r.request_id))
      expect((await t.fetch('/v1/activity', { key: null })).status).toBe(401)
      // The series: the same boundaries.
      expect((await t.fetch(`/v1/usage/series?key_id=${second.id}`)).status).toBe(403)
      const series = (await (await t.fetch('/v1/usage/series?group_by=key')).json()) as {
        data: { groups: { key_id: string }[] }[]
      }
      const keys = new Set(series.data.flatMap((b) => b.groups.map((g) => g.key_id)))
      expect([...keys]).toEqual([own])
    })

    test('paging: every row once, in order, while rows are being inserted', async () => {
      // A fresh organization with 300 rows over 40 milliseconds (ties cut by pages), then newer
      // and older rows written while the pages are read.
      const org = (await (
        await t.admin('/v1/admin/organizations', { name: `paging-${Date.now()}`, balance_rub: 1 })
      ).json()) as { id: string; master_key: string }
      const base = Date.now() - 60_000
      const rows = Array.from({ length: 300 }, (_, i) =>
        ledgerRow({
          requestId: `pg-${String(i).padStart(4, '0')}`,
          orgId: org.id,
          endedAtMs: base + (i % 40),
        }),
      )
      await t.svc.store.recordLedger(rows)
      const expected = [...rows]
        .sort((a, b) => b.endedAtMs - a.endedAtMs || (a.requestId < b.requestId ? 1 : -1))
        .map((r) => r.requestId)
      let writing = true
      let n = 0
      const writer = (async () => {
        while (writing) {
          await t.svc.store.recordLedger([
            ledgerRow({ requestId: `new-${n}`, orgId: org.id, endedAtMs: Date.now() }),
            ledgerRow({ requestId: `old-${n}`, orgId: org.id, endedAtMs: base - 1000 - n }),
          ])
          n++
          await Bun.sleep(1)
        }
      })()
      const seen: string[] = []
      let after: string | null = null
      for (let i = 0; i < 200; i++) {
        const p: Page = await page(`/v1/activity?limit=7${after ? `&after=${after}` : ''}`, org.master_key)
        seen.push(...p.data.map((r) => r.request_id))
        expect(p.first_id).toBe(p.data[0]?.request_id ?? null)
        after = p.last_id
        if (!p.has_more) break
      }
      writing = false
      await writer
      expect(n).toBeGreaterThan(0)
      expect(new Set(seen).size).toBe(seen.length)
      // The rows there before paging began: all of them, in order, none missing.
      expect(seen.filter((id) => id.startsWith('pg-'))).toEqual(expected)
      // Rows written during it appear only where the order put them: no new one after an old one.
      const firstOld = seen.findIndex((id) => id.startsWith('old-'))
      if (firstOld >= 0) expect(seen.slice(firstOld).every((id) => id.startsWith('old-'))).toBe(true)
    })

    test('format=csv: RFC 4180 with a header, quotes, commas and newlines round-trip; jsonl: one row a line', async () => {
      const org = (await (
        await t.admin('/v1/admin/organizations', { name: `csv-${Date.now()}`, balance_rub: 1 })
      ).json()) as { id: string; master_key: string }
      const odd = 'odd/mo,del "x"\r\nend'
      await t.svc.store.recordLedger(
        Array.from({ length: 2500 }, (_, i) =>
          ledgerRow({
            requestId: `csv-${i}`,
            orgId: org.id,
            model: i % 2 ? odd : 'test/chat',
            costNano: 123_456_789n + BigInt(i),
            endedAtMs: 1_700_000_000_000 + i,
            cachedTokens: i % 3 ? 7 : null,
          }),
        ),
      )
      const r = await t.fetch('/v1/activity?format=csv', { key: org.master_key })
      expect(r.status).toBe(200)
      expect(r.headers.get('content-type')).toStartWith('text/csv')
      expect(r.headers.get('content-disposition')).toContain(`filename="activity-${org.id}-start-now.csv"`)
      const records = parseCsv(await r.text())
      const [header, ...body] = records
      expect(header![0]).toBe('request_id')
      expect(body).toHaveLength(2500)
      const col = (name: string) => header!.indexOf(name)
      const byId = new Map(body.map((rec) => [rec[col('request_id')]!, rec]))
      for (const i of [0, 1, 2, 1234, 2499]) {
        const rec = byId.get(`csv-${i}`)!
        expect(rec).toHaveLength(header!.length)
        expect(rec[col('model')]).toBe(i % 2 ? odd : 'test/chat')
        expect(rec[col('cost_rub')]).toBe(formatRub(123_456_789n + BigInt(i)))
        expect(rec[col('cached_tokens')]).toBe(i % 3 ? '7' : '')
      }
      // Newest first, as the list.
      expect(body[0]![col('request_id')]).toBe('csv-2499')
      // A range, as JSON lines.
      const from = 1_700_000_000
      const j = await t.fetch(`/v1/activity?format=jsonl&from=${from}&to=${from + 1}&model=test/chat`, {
        key: org.master_key,
      })
      expect(j.headers.get('content-type')).toStartWith('application/jsonl')
      const lines = (await j.text())
        .trimEnd()
        .split('\n')
        .map((l) => JSON.parse(l) as Row)
      expect(lines).toHaveLength(500) // rows 0..999 fall in that second, half of them test/chat
      expect(lines.every((l) => l.model === 'test/chat' && l.ended_at_ms < (from + 1) * 1000)).toBe(true)
    })

    test('usage series: spend, requests and tokens per day by model, per hour, and in a time zone', async () => {
      const org = (await (
        await t.admin('/v1/admin/organizations', { name: `series-${Date.now()}`, balance_rub: 1 })
      ).json()) as { id: string; master_key: string }
      const day = Date.UTC(2026, 0, 10) // a UTC midnight
      await t.svc.store.recordLedger([
        ledgerRow({
          requestId: 's1',
          orgId: org.id,
          endedAtMs: day + 3_600_000,
          costNano: 1_500_000n,
          cachedTokens: 3,
        }),
        ledgerRow({ requestId: 's2', orgId: org.id, endedAtMs: day + 22 * 3_600_000, model: 'test/embed' }),
        ledgerRow({ requestId: 's3', orgId: org.id, endedAtMs: day + 86_400_000 + 60_000, costNano: 2_000n }),
        ledgerRow({ requestId: 's4', orgId: org.id, kind: 'credit', endedAtMs: day, costNano: 10n ** 9n }),
      ])
      const get = async (q: string) => {
        const r = await t.fetch(`/v1/usage/series?${q}`, { key: org.master_key })
        expect(r.status).toBe(200)
        return (await r.json()) as {
          from: number
          to: number
          data: {
            start: number
            end: number
            date?: string
            requests: number
            cost_rub: number
            cached_tokens: number
            prompt_tokens: number
            groups?: { model?: string; requests: number; cost_rub: number }[]
          }[]
        }
      }
      const from = day / 1000
      const byDay = await get(`bucket=day&group_by=model&from=${from}&to=${from + 3 * 86_400}`)
      expect(
        byDay.data.map((b) => [b.date, b.requests, b.cost_rub, b.prompt_tokens, b.cached_tokens]),
      ).toEqual([
        ['2026-01-10', 2, 0.001501, 20, 3],
        ['2026-01-11', 1, 0.000002, 10, 0],
        ['2026-01-12', 0, 0, 0, 0],
      ])
      expect(byDay.data[0]!.groups).toEqual([
        {
          model: 'test/chat',
          requests: 1,
          cost_rub: 0.0015,
          prompt_tokens: 10,
          completion_tokens: 5,
          cached_tokens: 3,
        },
        {
          model: 'test/embed',
          requests: 1,
          cost_rub: 0.000001,
          prompt_tokens: 10,
          completion_tokens: 5,
          cached_tokens: 0,
        },
      ] as never)
      // Moscow is UTC+3: 22:00 UTC on the 10th is the 11th there, and the days start at 21:00 UTC.
      const msk = await get(`bucket=day&tz=Europe/Moscow&from=${from}&to=${from + 2 * 86_400}`)
      expect(msk.from).toBe(from - 3 * 3600)
      expect(msk.data.map((b) => [b.date, b.start, b.requests])).toEqual([
        ['2026-01-10', from - 3 * 3600, 1],
        ['2026-01-11', from + 21 * 3600, 2],
        ['2026-01-12', from + 45 * 3600, 0],
      ])
      const hourly = await get(`bucket=hour&from=${from}&to=${from + 3 * 3600}`)
      expect(hourly.data.map((b) => [b.start, b.requests])).toEqual([
        [from, 0],
        [from + 3600, 1],
        [from + 7200, 0],
      ])
      for (const [q, param] of [
        ['tz=Asia/Kolkata', 'tz'],
        ['tz=Mars/Olympus', 'tz'],
        ['bucket=week', 'bucket'],
        ['group_by=node', 'group_by'],
        [`bucket=hour&from=${from}&to=${from + 40 * 86_400}`, 'from'],
      ] as const) {
        const r = await t.fetch(`/v1/usage/series?${q}`, { key: org.master_key })
        expect(r.status).toBe(400)
        expect(((await r.json()) as { error: { param: string } }).error.param).toBe(param)
      }
    })
  })
}
