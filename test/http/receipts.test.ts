import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Anthropic from '@anthropic-ai/sdk'
import { nanoToRubNumber } from '../../src/billing/money.ts'
import { startChatBatch, waitForCompleted } from '../helpers/batches.ts'
import { call, startCluster } from '../helpers/cluster.ts'
import { ADMIN_TOKEN, startTropa, type Tropa } from '../helpers/start.ts'

// Receipts (docs/api.md, "Receipts"): every billed answer carries an Ed25519 signature over what
// it was billed, verified here with WebCrypto alone against the keys the server publishes; a
// changed byte fails; the JSONL export carries the same receipts, and `tropa receipts verify`
// checks an export offline. On SQLite and PostgreSQL, and on a cluster of two nodes.

interface Jwk {
  kty: string
  crv: string
  x: string
  kid: string
}
interface KeySet {
  keys: Jwk[]
  current_kid: string
}
interface Payload {
  v: number
  request_id: string
  org_id: string
  key_id: string
  model: string
  prompt_tokens: number
  cached_tokens: number
  completion_tokens: number
  cost_nano: string
  ended_at_ms: number
}

const main = join(import.meta.dir, '../../src/main.ts')
const messages = [{ role: 'user' as const, content: 'Tell me about routers.' }]
const fromB64 = (s: string) => Buffer.from(s, 'base64url')
const b64 = (b: Uint8Array | string) => Buffer.from(b).toString('base64url')

/** The receipt's payload if it verifies with WebCrypto against `set`, else null. */
async function verify(jws: string, set: KeySet): Promise<Payload | null> {
  const [h, p, s] = jws.split('.') as [string, string, string]
  const header = JSON.parse(fromB64(h).toString()) as { alg: string; kid: string }
  expect(header.alg).toBe('EdDSA')
  const jwk = set.keys.find((k) => k.kid === header.kid)
  if (!jwk) return null
  const key = await crypto.subtle.importKey(
    'jwk',
    { kty: jwk.kty, crv: jwk.crv, x: jwk.x },
    { name: 'Ed25519' },
    false,
    ['verify'],
  )
  const ok = await crypto.subtle.verify('Ed25519', key, fromB64(s), new TextEncoder().encode(`${h}.${p}`))
  return ok ? (JSON.parse(fromB64(p).toString()) as Payload) : null
}

const kidOf = (jws: string) => (JSON.parse(fromB64(jws.split('.')[0]!).toString()) as { kid: string }).kid

/** The receipt with its payload's `field` changed to `value` (the signature kept). */
function tampered(jws: string, field: keyof Payload, value: unknown): string {
  const [h, p, s] = jws.split('.') as [string, string, string]
  const payload = JSON.parse(fromB64(p).toString()) as Record<string, unknown>
  payload[field] = value
  return `${h}.${b64(JSON.stringify(payload))}.${s}`
}

/** The receipt with one byte of its signature changed. */
function flipped(jws: string): string {
  const [h, p, s] = jws.split('.') as [string, string, string]
  const sig = fromB64(s)
  sig[10] = sig[10]! ^ 1
  return `${h}.${p}.${b64(sig)}`
}

const keySet = async (url: string) => {
  const res = await fetch(`${url}/.well-known/tropa-receipts.json`)
  expect(res.status).toBe(200)
  return (await res.json()) as KeySet
}

async function exportLines(t: Tropa): Promise<Record<string, unknown>[]> {
  const res = await t.fetch('/v1/activity?format=jsonl', { key: t.masterKey })
  expect(res.status).toBe(200)
  const text = await res.text()
  return text
    .split('\n')
    .filter((l) => l.length > 0)
    .map((l) => JSON.parse(l) as Record<string, unknown>)
}

/** `tropa receipts verify ...`, as a process (not blocking this one: it may fetch from the server here). */
async function cli(...args: string[]) {
  const p = Bun.spawn([process.execPath, main, 'receipts', 'verify', ...args], {
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const [out, err, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ])
  return { code, out: out + err }
}

for (const postgres of [false, true]) {
  describe(postgres ? 'PostgreSQL' : 'SQLite', () => {
    let t: Tropa
    let work: string
    beforeAll(async () => {
      t = await startTropa({ postgres, extra: { receipts: { responses: true } } })
      work = mkdtempSync(join(tmpdir(), 'tropa-receipts-'))
    })
    afterAll(async () => {
      await t.stop()
      rmSync(work, { recursive: true, force: true })
    })
    /** Receipts of this suite's requests, by request id (for the export's check). */
    const seen = new Map<string, string>()

    test('a non-streamed chat carries a receipt of its charge; a changed byte fails', async () => {
      const { data, response } = await t
        .client()
        .chat.completions.create({ model: 'test/chat', messages, max_tokens: 20 })
        .withResponse()
      const receipt = response.headers.get('x-tropa-receipt')!
      expect(receipt).toBeString()
      const usage = data.usage as typeof data.usage & { cost_rub: number; receipt: string }
      expect(usage.receipt).toBe(receipt)
      const set = await keySet(t.url)
      expect(set.keys).toHaveLength(1)
      expect(kidOf(receipt)).toBe(set.current_kid)
      const p = (await verify(receipt, set))!
      expect(p).not.toBeNull()
      const id = response.headers.get('x-request-id')!
      expect(p).toMatchObject({
        v: 1,
        request_id: id,
        org_id: t.orgId,
        model: 'test/chat',
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        cached_tokens: 0,
      })
      expect(nanoToRubNumber(BigInt(p.cost_nano))).toBe(usage.cost_rub)
      expect(usage.cost_rub).toBeGreaterThan(0)
      expect(p.key_id).toStartWith('key_')
      seen.set(id, receipt)

      // Any change: the cost, the tokens, the organization, a bit of the signature.
      expect(
        await verify(tampered(receipt, 'cost_nano', String(BigInt(p.cost_nano) - 1000n)), set),
      ).toBeNull()
      expect(await verify(tampered(receipt, 'completion_tokens', p.completion_tokens - 1), set)).toBeNull()
      expect(await verify(tampered(receipt, 'org_id', 'org_other'), set)).toBeNull()
      expect(await verify(flipped(receipt), set)).toBeNull()
    })

    test('a streamed chat carries its receipt in the usage chunk', async () => {
      const stream = await t.client().chat.completions.create({
        model: 'test/chat',
        messages,
        max_tokens: 30,
        stream: true,
        stream_options: { include_usage: true },
      })
      let text = ''
      let usage:
        | { prompt_tokens: number; completion_tokens: number; cost_rub: number; receipt: string }
        | undefined
      let id = ''
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta.content ?? ''
        if (chunk.usage) usage = chunk.usage as unknown as typeof usage
        id = chunk.id
      }
      expect(text.length).toBeGreaterThan(0)
      expect(usage?.receipt).toBeString()
      const p = (await verify(usage!.receipt, await keySet(t.url)))!
      expect(p).not.toBeNull()
      expect(`chatcmpl-${p.request_id}`).toBe(id)
      expect(p.completion_tokens).toBe(usage!.completion_tokens)
      expect(p.prompt_tokens).toBe(usage!.prompt_tokens)
      expect(nanoToRubNumber(BigInt(p.cost_nano))).toBe(usage!.cost_rub)
      seen.set(p.request_id, usage!.receipt)
    })

    test('embeddings and the Messages API carry receipts too', async () => {
      const { response } = await t
        .client()
        .embeddings.create({ model: 'test/embed', input: 'hello' })
        .withResponse()
      const e = (await verify(response.headers.get('x-tropa-receipt')!, await keySet(t.url)))!
      expect(e).toMatchObject({ model: 'test/embed', completion_tokens: 0 })
      seen.set(e.request_id, response.headers.get('x-tropa-receipt')!)
      const res = await t.fetch('/v1/messages', {
        method: 'POST',
        headers: { 'x-api-key': t.apiKey, 'anthropic-version': '2023-06-01' },
        key: null,
        body: JSON.stringify({ model: 'test/chat', max_tokens: 16, messages }),
      })
      expect(res.status).toBe(200)
      const body = (await res.json()) as { usage: { receipt: string; output_tokens: number } }
      expect(body.usage.receipt).toBe(res.headers.get('x-tropa-receipt')!)
      const m = (await verify(body.usage.receipt, await keySet(t.url)))!
      expect(m.completion_tokens).toBe(body.usage.output_tokens)
      seen.set(m.request_id, body.usage.receipt)
    })

    test('streams of the Messages and Responses APIs end with their receipt', async () => {
      const set = await keySet(t.url)
      const anthropic = new Anthropic({ baseURL: t.url, apiKey: t.apiKey, maxRetries: 0 })
      const stream = anthropic.messages.stream({ model: 'test/chat', max_tokens: 16, messages })
      let usage: { output_tokens: number; receipt?: string } | undefined
      for await (const ev of stream)
        if (ev.type === 'message_delta') usage = ev.usage as unknown as typeof usage
      const m = (await verify(usage!.receipt!, set))!
      expect(m.completion_tokens).toBe(usage!.output_tokens)
      seen.set(m.request_id, usage!.receipt!)

      const events = await t.client().responses.create({ model: 'test/chat', input: 'Hello', stream: true })
      let done: { output_tokens: number; receipt?: string } | undefined
      for await (const ev of events)
        if (ev.type === 'response.completed') done = ev.response.usage as unknown as typeof done
      const r = (await verify(done!.receipt!, set))!
      expect(r.completion_tokens).toBe(done!.output_tokens)
      seen.set(r.request_id, done!.receipt!)
    })

    test('only the admin rotates the receipt key', async () => {
      const res = await t.fetch('/v1/admin/receipt-keys/rotate', {
        method: 'POST',
        key: t.masterKey,
        body: '{}',
      })
      expect(res.status).toBe(403)
      expect((await keySet(t.url)).keys).toHaveLength(1)
    })

    test('the JSONL export carries each row’s receipt, the very one its answer carried', async () => {
      const set = await keySet(t.url)
      const lines = await exportLines(t)
      expect(lines.length).toBe(seen.size)
      for (const line of lines) {
        const receipt = line.receipt as string
        expect(receipt).toBe(seen.get(line.request_id as string)!)
        const p = (await verify(receipt, set))!
        expect(p).toMatchObject({
          request_id: line.request_id,
          key_id: line.key_id,
          prompt_tokens: line.prompt_tokens,
          completion_tokens: line.completion_tokens,
          ended_at_ms: line.ended_at_ms,
        })
        expect(nanoToRubNumber(BigInt(p.cost_nano))).toBe(line.cost_rub as number)
      }
    })

    test('after a rotation new receipts use the new key and the old ones still verify', async () => {
      const before = await keySet(t.url)
      const res = await t.admin('/v1/admin/receipt-keys/rotate', {})
      expect(res.status).toBe(200)
      const rotated = (await res.json()) as KeySet
      expect(rotated.current_kid).not.toBe(before.current_kid)
      const after = await keySet(t.url)
      expect(after.current_kid).toBe(rotated.current_kid)
      expect(after.keys.map((k) => k.kid)).toEqual([before.current_kid, after.current_kid])
      const { response } = await t
        .client()
        .chat.completions.create({ model: 'test/chat', messages, max_tokens: 5 })
        .withResponse()
      const fresh = response.headers.get('x-tropa-receipt')!
      expect(kidOf(fresh)).toBe(after.current_kid)
      expect(await verify(fresh, after)).not.toBeNull()
      // Not with the old key alone.
      expect(await verify(fresh, before)).toBeNull()
      seen.set(response.headers.get('x-request-id')!, fresh)
      for (const old of seen.values()) expect(await verify(old, after)).not.toBeNull()
      // The export signs each row with the key that signed its answer.
      for (const line of await exportLines(t)) expect(line.receipt).toBe(seen.get(line.request_id as string)!)
    })

    test('tropa receipts verify checks an export offline, and fails on a changed byte', async () => {
      const res = await t.fetch('/v1/activity?format=jsonl', { key: t.masterKey })
      const file = join(work, 'export.jsonl')
      writeFileSync(file, await res.text())
      const keys = join(work, 'keys.json')
      writeFileSync(keys, JSON.stringify(await keySet(t.url)))
      const good = await cli(file, '--keys', keys)
      expect(good.out).toContain(`${seen.size} lines: ${seen.size} ok, 0 failed`)
      expect(good.code).toBe(0)
      // The keys fetched from the server itself.
      const byUrl = await cli(file, '--keys', `${t.url}/.well-known/tropa-receipts.json`, '--quiet')
      expect(byUrl.code).toBe(0)

      const text = readFileSync(file, 'utf8')
      const lines = text.trimEnd().split('\n')
      const first = JSON.parse(lines[0]!) as { cost_rub: number; completion_tokens: number; receipt: string }
      // The line's cost lowered: its receipt says otherwise.
      const cheaper = join(work, 'cheaper.jsonl')
      writeFileSync(
        cheaper,
        [JSON.stringify({ ...first, cost_rub: first.cost_rub - 0.000001 }), ...lines.slice(1)].join('\n'),
      )
      const r1 = await cli(cheaper, '--keys', keys)
      expect(r1.code).toBe(1)
      expect(r1.out).toContain('FAILED')
      expect(r1.out).toContain('cost_rub')
      // The receipt itself changed (its tokens), so its signature no longer matches.
      const forged = join(work, 'forged.jsonl')
      writeFileSync(
        forged,
        [
          JSON.stringify({
            ...first,
            completion_tokens: first.completion_tokens + 1,
            receipt: tampered(first.receipt, 'completion_tokens', first.completion_tokens + 1),
          }),
          ...lines.slice(1),
        ].join('\n'),
      )
      const r2 = await cli(forged, '--keys', keys)
      expect(r2.code).toBe(1)
      expect(r2.out).toContain('the signature does not match')
      // A line whose receipt was removed is not passed either.
      const bare = join(work, 'bare.jsonl')
      writeFileSync(bare, [JSON.stringify({ ...first, receipt: null }), ...lines.slice(1)].join('\n'))
      expect((await cli(bare, '--keys', keys)).code).toBe(1)
      expect((await cli(bare, '--keys', keys, '--allow-unsigned')).code).toBe(0)
    })
  })
}

test('by default answers carry no receipt, and the export carries each row’s, signed then', async () => {
  const t = await startTropa()
  try {
    const { response } = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages, max_tokens: 5 })
      .withResponse()
    expect(response.headers.get('x-tropa-cost-rub')).toBeString()
    expect(response.headers.get('x-tropa-receipt')).toBeNull()
    const set = await keySet(t.url)
    const [line] = await exportLines(t)
    expect(line!.request_id).toBe(response.headers.get('x-request-id')!)
    const p = (await verify(line!.receipt as string, set))!
    expect(p).toMatchObject({
      request_id: line!.request_id,
      org_id: t.orgId,
      completion_tokens: line!.completion_tokens,
    })
    expect(nanoToRubNumber(BigInt(p.cost_nano))).toBe(line!.cost_rub as number)
    expect(kidOf(line!.receipt as string)).toBe(set.current_kid)

    // Batch lines: their rows (written by a worker thread) carry receipts too.
    const batch = await startChatBatch(t.client(), 3)
    expect(await waitForCompleted(t.client(), batch.id, 3, 500)).toBe(3)
    const lines = (await exportLines(t)).filter((l) => l.batch_id === batch.id)
    expect(lines).toHaveLength(3)
    for (const l of lines) {
      const q = (await verify(l.receipt as string, set))!
      expect(q).toMatchObject({ request_id: l.request_id, completion_tokens: l.completion_tokens })
      expect(nanoToRubNumber(BigInt(q.cost_nano))).toBe(l.cost_rub as number)
    }
  } finally {
    await t.stop()
  }
})

test('receipts.enabled = false: no receipt, no key set', async () => {
  const t = await startTropa({ extra: { receipts: { enabled: false, responses: true } } })
  try {
    const { response } = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages, max_tokens: 5 })
      .withResponse()
    expect(response.headers.get('x-tropa-cost-rub')).toBeString()
    expect(response.headers.get('x-tropa-receipt')).toBeNull()
    const res = await fetch(`${t.url}/.well-known/tropa-receipts.json`)
    expect(res.status).toBe(404)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('receipts_disabled')
    const [line] = await exportLines(t)
    expect(line).not.toHaveProperty('receipt')
  } finally {
    await t.stop()
  }
})

describe('a cluster of two nodes', () => {
  let cluster: Awaited<ReturnType<typeof startCluster>>
  beforeAll(async () => {
    cluster = await startCluster(2, undefined, { receipts: { responses: true } })
  })
  afterAll(() => cluster.stop())

  test('both nodes sign with the same published key, and a rotation on one reaches the other', async () => {
    const [a, b] = cluster.nodes as unknown as [{ url: string }, { url: string }]
    const org = (await (
      await call(a.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'receipts', balance_rub: 100 })
    ).json()) as { id: string; master_key: string }
    const key = (
      (await (await call(a.url, '/v1/keys', org.master_key, { name: 'k' })).json()) as { key: string }
    ).key
    await Bun.sleep(50) // the new key's event reaches the other node
    const chat = async (url: string) => {
      const res = await call(url, '/v1/chat/completions', key, {
        model: 'test/chat',
        messages,
        max_tokens: 5,
      })
      expect(res.status).toBe(200)
      return res.headers.get('x-tropa-receipt')!
    }
    const setA = await keySet(a.url)
    expect(await keySet(b.url)).toEqual(setA)
    expect(setA.keys).toHaveLength(1)
    const ra = await chat(a.url)
    const rb = await chat(b.url)
    expect(kidOf(ra)).toBe(setA.current_kid)
    expect(kidOf(rb)).toBe(setA.current_kid)
    expect(await verify(ra, setA)).not.toBeNull()
    expect(await verify(rb, setA)).not.toBeNull()

    // Rotated on A: B signs with the new key and publishes it as soon as the call returns.
    const rotated = (await (
      await call(a.url, '/v1/admin/receipt-keys/rotate', ADMIN_TOKEN, {})
    ).json()) as KeySet
    const setB = await keySet(b.url)
    expect(setB.current_kid).toBe(rotated.current_kid)
    expect(setB.keys).toHaveLength(2)
    const rb2 = await chat(b.url)
    expect(kidOf(rb2)).toBe(rotated.current_kid)
    expect(await verify(rb2, await keySet(a.url))).not.toBeNull()
    // The export, from either node, verifies with either node's keys. Node A's row reaches the
    // shared store with its next ledger flush (every 250 ms): read until all three are there.
    let lines: { receipt: string }[] = []
    for (let i = 0; i < 100 && lines.length < 3; i++) {
      if (i > 0) await Bun.sleep(50)
      const res = await call(b.url, '/v1/activity?format=jsonl', org.master_key)
      lines = (await res.text())
        .trimEnd()
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as { receipt: string })
    }
    expect(lines).toHaveLength(3)
    expect(new Set(lines.map((l) => l.receipt))).toEqual(new Set([ra, rb, rb2]))
  })
})
