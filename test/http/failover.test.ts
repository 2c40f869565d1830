import { afterEach, describe, expect, test } from 'bun:test'
import { startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const body = { model: 'test/chat', messages: [{ role: 'user' as const, content: 'hello' }], max_tokens: 8 }

describe('failover before the first byte', () => {
  test('a node that refuses connections: no client request fails', async () => {
    t = await startTropa()
    await t.nodes[1]!.stop() // its port now refuses connections
    const client = t.client()
    // More requests at once than the retry budget's burst (10) are sent to the dead node before
    // any of them fails: moving on from a refused connection must not need that budget.
    const results = await Promise.all(
      Array.from({ length: 90 }, (_, i) =>
        i % 2 === 0
          ? client.chat.completions.create(body).then((r) => r.choices.length)
          : client.chat.completions.create({ ...body, stream: true }).then(async (s) => {
              let n = 0
              for await (const _ of s) n++
              return n > 0 ? 1 : 0
            }),
      ),
    )
    expect(results.every((n) => n === 1)).toBe(true)
    const failures = [...t.svc.deps.pool.nodes.values()].find((n) => n.name === 'sim-2')!.failures
    expect(failures).toBeGreaterThan(0)
  })

  test('a node answering 503: no client request fails, and it stops receiving traffic', async () => {
    t = await startTropa()
    t.nodes[0]!.setFaults({ rate503: 1 })
    const client = t.client()
    for (let i = 0; i < 20; i++) {
      const r = await client.chat.completions.create(i % 2 ? body : { ...body, stream: false })
      expect(r.choices.length).toBe(1)
    }
    const sim1 = [...t.svc.deps.pool.nodes.values()].find((n) => n.name === 'sim-1')!
    // Each 503 prices the node out (its prefill rate collapses) or ejects it: it is tried rarely.
    expect(sim1.failures).toBeGreaterThan(0)
    expect(sim1.failures).toBeLessThanOrEqual(3)
    const failedBefore = sim1.failures
    for (let i = 0; i < 10; i++) await client.chat.completions.create(body)
    expect(sim1.failures - failedBefore).toBeLessThanOrEqual(1)
  })

  test('a node that hangs: the first-byte timeout fails over', async () => {
    t = await startTropa({ upstream: { first_byte_timeout_ms: 300 } })
    t.nodes[2]!.setFaults({ hang: true })
    const client = t.client()
    for (let i = 0; i < 6; i++) {
      const s = await client.chat.completions.create({ ...body, stream: true })
      let text = ''
      for await (const c of s) text += c.choices[0]?.delta.content ?? ''
      expect(text.length).toBeGreaterThan(0)
    }
  })

  test('every node down: 502/503 in the OpenAI shape, nothing billed', async () => {
    t = await startTropa()
    for (const n of t.nodes) n.setFaults({ rate503: 1 })
    const res = await t.fetch('/v1/chat/completions', { method: 'POST', body: JSON.stringify(body) })
    expect([502, 503]).toContain(res.status)
    const json = (await res.json()) as { error: { type: string; code: string } }
    expect(json.error.code).toMatch(/upstream_error|no_upstream_available/)
    await t.svc.ledger.flush()
    expect(await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).toHaveLength(1) // the opening credit only
  })
})

describe('after the first byte', () => {
  test('a stream cut mid-way ends with one error event, and the sent tokens are billed', async () => {
    t = await startTropa({ nodes: [{ name: 'cut', itlMs: 2, faults: { cutAfterTokens: 3 } }] })
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ ...body, stream: true, max_tokens: 40 }),
    })
    expect(res.status).toBe(200)
    const events = (await res.text()).split('\n\n').filter(Boolean)
    const last = JSON.parse(events.at(-1)!.slice(6)) as { error?: { code: string } }
    expect(last.error?.code).toBe('upstream_error')
    expect(events.some((e) => e === 'data: [DONE]')).toBe(false)
    await t.svc.ledger.flush()
    const rows = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
      (r) => r.kind === 'usage',
    )
    expect(rows).toHaveLength(1)
    expect(rows[0]!.estimated).toBe(true)
    expect(rows[0]!.completionTokens).toBe(3)
  })

  test('a client that disconnects mid-stream cancels the upstream and pays for what it was sent', async () => {
    t = await startTropa({ nodes: [{ name: 'slow', itlMs: 20, timeScale: 1 }] })
    const controller = new AbortController()
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ ...body, stream: true, max_tokens: 60 }),
      signal: controller.signal,
    })
    const reader = res.body!.getReader()
    let received = ''
    while (!received.includes('"content":"') || received.split('"content":"').length < 4) {
      const { value } = await reader.read()
      received += new TextDecoder().decode(value)
    }
    controller.abort()
    await Bun.sleep(200)
    expect(t.nodes[0]!.stats().aborted).toBe(1)
    await t.svc.ledger.flush()
    const rows = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
      (r) => r.kind === 'usage',
    )
    expect(rows).toHaveLength(1)
    expect(rows[0]!.outcome).toBe('client_disconnected')
    expect(rows[0]!.completionTokens).toBeGreaterThan(0)
    expect(rows[0]!.completionTokens).toBeLessThan(60)
    expect([...t.svc.deps.pool.nodes.values()][0]!.inFlight).toBe(0)
  })
})
