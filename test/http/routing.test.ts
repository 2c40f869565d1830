import { afterEach, describe, expect, test } from 'bun:test'
import type { NodeState } from '../../src/routing/nodes.ts'
import type { PredictedTtft } from '../../src/routing/predicted.ts'
import type { SimNode } from '../../src/simulator/index.ts'
import { ADMIN_TOKEN, CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

/** A chat model on the given nodes, with per-node weights (and route options for every route). */
const modelsWith =
  (weights: number[], routeOptions: Record<string, unknown> = {}) =>
  (nodes: SimNode[]) => [
    {
      id: 'test/chat',
      owned_by: 'test',
      kind: 'chat' as const,
      context_length: 32_768,
      pricing: CHAT_PRICE,
      routes: nodes.map((n, i) => ({
        name: n.name,
        base_url: n.url,
        upstream_model: 'chat-up',
        max_concurrency: 64,
        weight: weights[i] ?? 1,
        ...routeOptions,
      })),
    },
  ]

const nodeOf = (r: Response) => r.headers.get('x-tropa-node')

async function chat(tropa: Tropa, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  const res = await tropa.fetch('/v1/chat/completions', {
    method: 'POST',
    headers,
    body: JSON.stringify({ model: 'test/chat', max_tokens: 4, ...body }),
  })
  expect(res.status).toBe(200)
  return {
    node: nodeOf(res),
    json: (await res.json()) as { usage: { prompt_tokens_details?: { cached_tokens?: number } } },
  }
}

/**
 * Three nodes, a ~1,000-token system prompt answered once (its node the holder), then eight long
 * answers decoding on the holder: a new session with that prompt is spread off it.
 */
async function busyHolder() {
  t = await startTropa({
    nodes: [1, 2, 3].map((i) => ({
      name: `sim-${i}`,
      seed: i,
      itlMs: 20,
      iterationOverheadMs: 1,
      ignoreEos: true,
    })),
    // On by default where a node's /metrics were read (self-hosted engines): on here from the
    // start, before the first poll.
    models: modelsWith([1, 1, 1], { warm_sessions: true }),
  })
  const system = 'You are the support agent of a large router. Answer briefly. '.repeat(70) // ~1,000 tokens
  const ask = (content: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
    t!.fetch('/v1/chat/completions', {
      method: 'POST',
      headers,
      body: JSON.stringify({
        model: 'test/chat',
        messages: [
          { role: 'system', content: system },
          { role: 'user', content },
        ],
        ...extra,
      }),
    })
  // The system prompt's first request makes its node the holder.
  const first = await ask('hello', { max_tokens: 2 })
  expect(first.status).toBe(200)
  await first.arrayBuffer()
  const holder = nodeOf(first)!
  // Long answers decoding on the holder (its cached prefix draws them there).
  const busy: Response[] = []
  for (let i = 0; i < 8; i++) {
    const r = await ask(`long answer ${i}`, { max_tokens: 400, stream: true })
    expect(r.status).toBe(200)
    busy.push(r)
    const reader = r.body!.getReader()
    await reader.read() // its first token: decoding now
    reader.releaseLock()
  }
  expect(busy.filter((r) => nodeOf(r) === holder).length).toBeGreaterThanOrEqual(4)
  return { tropa: t!, ask, holder, busy }
}

describe('routing over real HTTP', () => {
  test('prompts sharing a long prefix go where that prefix is cached, and hit the cache', async () => {
    t = await startTropa({
      nodes: [1, 2, 3].map((i) => ({
        name: `sim-${i}`,
        timeScale: 1,
        itlMs: 1,
        iterationOverheadMs: 0,
        seed: i,
      })),
      models: modelsWith([1, 1, 1]),
    })
    const prefixes = ['alpha', 'bravo', 'charlie', 'delta'].map((w) => `${w} policy manual. `.repeat(150))
    const home = new Map<number, string>()
    let sameNode = 0
    let cached = 0
    let total = 0
    for (let round = 0; round < 5; round++)
      for (let g = 0; g < prefixes.length; g++) {
        const r = await chat(t, {
          messages: [
            { role: 'system', content: prefixes[g] },
            { role: 'user', content: `question ${round}` },
          ],
        })
        total++
        if (round === 0) home.set(g, r.node!)
        else {
          if (r.node === home.get(g)) sameNode++
          if ((r.json.usage.prompt_tokens_details?.cached_tokens ?? 0) > 500) cached++
        }
      }
    // 16 follow-ups: all to the node holding their prefix, served from its cache.
    expect(sameNode).toBe(16)
    expect(cached).toBe(16)
    expect(total).toBe(20)
  })

  test('a session hint keeps a conversation on one node', async () => {
    t = await startTropa({
      nodes: [1, 2, 3].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })),
      models: modelsWith([1, 1, 1]),
    })
    for (const how of ['user', 'header'] as const) {
      const seen = new Set<string | null>()
      for (let i = 0; i < 12; i++) {
        const body = {
          messages: [{ role: 'user', content: `turn ${i}` }],
          ...(how === 'user' && { user: 'u-42' }),
        }
        const r = await chat(t, body, how === 'header' ? { 'x-session-id': 's-42' } : {})
        seen.add(r.node)
      }
      expect(seen.size).toBe(1)
    }
  })

  test('a late first token is hedged to another node; the client gets its stream from the winner', async () => {
    t = await startTropa({
      nodes: [1, 2].map((i) => ({
        name: `sim-${i}`,
        timeScale: 1,
        itlMs: 1,
        iterationOverheadMs: 0,
        seed: i,
      })),
      // sim-1 looks ten times better, so it gets the traffic until it misbehaves.
      models: modelsWith([10, 1]),
      upstream: { first_byte_timeout_ms: 10_000 },
    })
    const client = t.client()
    const streamOnce = async () => {
      const s = await client.chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'hello' }],
        max_tokens: 3,
        stream: true,
      })
      let chunks = 0
      for await (const _ of s) chunks++
      return chunks
    }
    for (let i = 0; i < 30; i++) expect(await streamOnce()).toBeGreaterThan(0)
    expect(t.svc.deps.hedges!.used).toBe(0)
    const before = t.nodes[0]!.stats()
    t.nodes[0]!.setFaults({ hang: true })
    const started = Date.now()
    for (let i = 0; i < 3; i++) expect(await streamOnce()).toBeGreaterThan(0)
    const elapsed = Date.now() - started
    // Without hedging each of these would wait out the 10 s first-byte timeout on sim-1.
    expect(elapsed).toBeLessThan(5_000)
    expect(t.svc.deps.hedges!.used).toBeGreaterThanOrEqual(1)
    // The losing copies on sim-1 were cancelled, not left hanging.
    await Bun.sleep(50)
    const after = t.nodes[0]!.stats()
    expect(after.requests - before.requests).toBeGreaterThanOrEqual(1)
    expect(after.aborted - before.aborted).toBe(after.requests - before.requests)
  })

  test('a hung node is ejected by active health checks, and returns when it answers again', async () => {
    t = await startTropa({
      nodes: [1, 2].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })),
      models: modelsWith([1, 1]),
      upstream: { connect_timeout_ms: 200 },
      extra: { routing: { health_check_ms: 100 } },
    })
    const sim1 = t.svc.deps.pool.nodes.get(t.nodes[0]!.url)!
    t.nodes[0]!.setFaults({ hang: true })
    await Bun.sleep(700)
    expect(sim1.available(Date.now())).toBe(false)
    t.nodes[0]!.setFaults({ hang: false })
    await Bun.sleep(400)
    expect(sim1.available(Date.now())).toBe(true)
    // It comes back gradually: a few requests at a time at first (the cap grows over 10 s).
    for (let i = 0; i < 4; i++) t.svc.deps.pool.begin(sim1)
    expect(sim1.available(Date.now())).toBe(false)
    for (let i = 0; i < 4; i++) t.svc.deps.pool.cancel(sim1)
    expect(sim1.available(Date.now())).toBe(true)
  })

  test("nodes' Prometheus metrics are polled into the policy", async () => {
    t = await startTropa({
      nodes: [1, 2].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })),
      models: modelsWith([1, 1]),
      extra: { routing: { metrics_poll_ms: 50 } },
    })
    const policy = t.svc.deps.policy as PredictedTtft
    const sim1 = t.svc.deps.pool.nodes.get(t.nodes[0]!.url)!
    const before = Date.now()
    await Bun.sleep(300)
    // The simulator serves vLLM's gauge names at <origin>/metrics.
    expect(policy.model(sim1).metricAtMs).toBeGreaterThanOrEqual(before)
  })

  test('/metrics shows what the policy has learned per node', async () => {
    t = await startTropa({
      nodes: [1, 2].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })),
      models: modelsWith([1, 1]),
    })
    for (let i = 0; i < 4; i++)
      await chat(t, { messages: [{ role: 'user', content: `hi ${i}` }], stream: false })
    const text = await (await fetch(`${t.url}/metrics`)).text()
    expect(text).toMatch(/tropa_node_prefill_tokens_per_second\{node="sim-1"\} \d/)
    // No slowdown seen: the factor on the prediction is 1.
    expect(text).toMatch(/^tropa_node_slowness\{node="sim-2"\} 1$/m)
    expect(text).toMatch(/tropa_hedges_total \d/)
    expect((t.svc.deps.policy as PredictedTtft).snapshot(Date.now()).length).toBe(2)
  })

  test('a node slowed down is found from short first tokens and priced up; /metrics and /v1/admin/fleet show its factor', async () => {
    // Short prompts (about 200 tokens: under the 512 a prefill rate is learnt from, over the 64
    // whose first token measures the round trip): only the first tokens' lateness shows the
    // slowdown (routing/predicted.ts `observeShort`).
    t = await startTropa({
      nodes: [1, 2, 3, 4].map((i) => ({
        name: `sim-${i}`,
        seed: i,
        itlMs: 20,
        iterationOverheadMs: 1,
        ...(i === 2 && { faults: { slowdownFactor: 4 } }),
      })),
      // No hedges: each request's first token is its node's own.
      models: modelsWith([1, 1, 1, 1], { hedge: false }),
    })
    const send = async (i: number) => {
      const res = await t!.fetch('/v1/chat/completions', {
        method: 'POST',
        body: JSON.stringify({
          model: 'test/chat',
          max_tokens: 4,
          stream: true,
          messages: [
            { role: 'user', content: `question ${i} of a slowed fleet: ${'many words '.repeat(90)}` },
          ],
        }),
      })
      expect(res.status).toBe(200)
      expect(await res.text()).toContain('data: [DONE]')
      return { node: nodeOf(res) }
    }
    const round = async (from: number, n: number, together: number) => {
      const nodes: (string | null)[] = []
      for (let i = from; i < from + n; i += together)
        nodes.push(
          ...(await Promise.all(Array.from({ length: together }, (_, k) => send(i + k)))).map((r) => r.node),
        )
      return nodes
    }
    const first = await round(0, 32, 4)
    expect(first.filter((n) => n === 'sim-2').length).toBeGreaterThan(0)
    const text = await (await fetch(`${t.url}/metrics`)).text()
    const factor = Number(/^tropa_node_slowness\{node="sim-2"\} (\S+)$/m.exec(text)?.[1])
    expect(factor).toBeGreaterThanOrEqual(2)
    for (const other of ['sim-1', 'sim-3', 'sim-4'])
      expect(text).toMatch(new RegExp(`^tropa_node_slowness\\{node="${other}"\\} 1$`, 'm'))
    const fleet = (await (
      await fetch(`${t.url}/v1/admin/fleet`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
    ).json()) as { data: { node: string; slowness: number | null }[] }
    expect(fleet.data.find((n) => n.node === 'sim-2')?.slowness).toBeGreaterThanOrEqual(2)
    // Priced up: two at a time, the next requests go to the other three nodes.
    const next = await round(100, 24, 2)
    expect(next.filter((n) => n === 'sim-2').length).toBeLessThanOrEqual(1)
  })

  test("a new session spread off its prefix's busy node is served there, and its new node is warmed with its prompt", async () => {
    const { tropa, ask, holder, busy } = await busyHolder()
    t = tropa
    const stats = () => Object.fromEntries(t!.nodes.map((n) => [n.name, n.stats()]))
    const before = stats()
    const warmups = t.svc.deps.warmups!.sentCount.session
    // A new session with the same system prompt, streamed: its first turn is served where the
    // prompt is cached, and one other node gets the same prompt for one token, to hold the session.
    const turn1 = await ask(
      'a new conversation starts',
      { max_completion_tokens: 3, stream: true, stream_options: { include_usage: true } },
      { 'x-session-id': 'conv-1' },
    )
    expect(turn1.status).toBe(200)
    const events = (await turn1.text()).split('\n\n').filter((e) => e.startsWith('data: {'))
    const usage1 = (
      JSON.parse(events.at(-1)!.slice(6)) as {
        usage: { completion_tokens: number; prompt_tokens_details?: { cached_tokens?: number } }
      }
    ).usage
    expect(nodeOf(turn1)).toBe(holder)
    expect(usage1.completion_tokens).toBe(3)
    expect(usage1.prompt_tokens_details?.cached_tokens ?? 0).toBeGreaterThan(500)
    expect(t.svc.deps.warmups!.sentCount.session).toBe(warmups + 1)
    let warmed: string | undefined
    for (let i = 0; i < 100 && warmed === undefined; i++) {
      const now = stats()
      warmed = t.nodes
        .map((n) => n.name)
        .find((n) => n !== holder && now[n]!.chatRequests > before[n]!.chatRequests && now[n]!.running === 0)
      if (warmed === undefined) await Bun.sleep(20)
    }
    expect(warmed).toBeDefined()
    const after = stats()[warmed!]!
    // One request, one token out (streamed: its first chunk times the node's prefill).
    expect(after.chatRequests - before[warmed!]!.chatRequests).toBe(1)
    expect(after.completionTokens - before[warmed!]!.completionTokens).toBe(1)
    expect(after.streams - before[warmed!]!.streams).toBe(1)
    // The session's next turn goes to the warmed node and finds its prompt there.
    const turn2 = await ask('a new conversation starts', { max_tokens: 2 }, { 'x-session-id': 'conv-1' })
    expect(turn2.status).toBe(200)
    const answer2 = (await turn2.json()) as { usage: { prompt_tokens_details?: { cached_tokens?: number } } }
    expect(nodeOf(turn2)).toBe(warmed!)
    expect(answer2.usage.prompt_tokens_details?.cached_tokens ?? 0).toBeGreaterThan(500)
    const text = await (await fetch(`${t.url}/metrics`)).text()
    expect(text).toMatch(/^tropa_warmups_total\{reason="session"\} 1$/m)
    expect(text).toMatch(/^tropa_warmups_failed_total\{reason="session"\} 0$/m)
    for (const r of busy) await r.body?.cancel()
    // Billed to no one: the ledger holds the client's requests only (1 + 8 + 2 turns), and the
    // two turns exactly what they were answered.
    await t.svc.ledger.flush()
    const rows = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
      (r) => r.kind === 'usage',
    )
    for (let i = 0; i < 100 && rows.length < 11; i++) {
      await Bun.sleep(20)
      await t.svc.ledger.flush()
      rows.splice(
        0,
        rows.length,
        ...(await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter((r) => r.kind === 'usage'),
      )
    }
    expect(rows.length).toBe(11)
    expect(rows.filter((r) => r.completionTokens === 1)).toHaveLength(0)
  }, 30_000)

  test('a node never measured is measured by a warm-up of a long prompt before any client request goes there', async () => {
    // sim-3 is another kind of accelerator (its own KV-cache size in /metrics: no measured twin),
    // four times slower; it joins once sim-1 and sim-2 are measured.
    t = await startTropa({
      nodes: [1, 2, 3].map((i) => ({
        name: `sim-${i}`,
        seed: i,
        itlMs: 5,
        iterationOverheadMs: 1,
        ...(i === 3 && { cacheBlocks: 2048, faults: { hang: true, slowdownFactor: 4 } }),
      })),
      models: modelsWith([1, 1, 1], { hedge: false, warm_sessions: true }),
      upstream: { connect_timeout_ms: 200 },
      extra: { routing: { health_check_ms: 100, metrics_poll_ms: 50 } },
    })
    const policy = t.svc.deps.policy as PredictedTtft
    const [sim1, sim2, sim3] = t.nodes.map((n) => t!.svc.deps.pool.nodes.get(n.url)!) as [
      NodeState,
      NodeState,
      NodeState,
    ]
    for (let i = 0; i < 100 && sim3.available(Date.now()); i++) await Bun.sleep(20)
    expect(sim3.available(Date.now())).toBe(false)
    // sim-1 and sim-2 polled (the same cache size: twins), so that the first of them measured
    // prices the other, with no warm-up.
    const polled = (n: NodeState) => policy.model(n).metricAtMs > Number.NEGATIVE_INFINITY
    for (let i = 0; i < 100 && !(polled(sim1) && polled(sim2)); i++) await Bun.sleep(20)
    // Long prompts, each its own (about 1,400 tokens: a first token that teaches a prefill rate).
    const send = async (i: number) => {
      const res = await t!.fetch('/v1/chat/completions', {
        method: 'POST',
        body: JSON.stringify({
          model: 'test/chat',
          max_tokens: 2,
          stream: true,
          messages: [{ role: 'user', content: `question ${i}: ${'many words '.repeat(500)}` }],
        }),
      })
      expect(res.status).toBe(200)
      expect(await res.text()).toContain('data: [DONE]')
      return nodeOf(res)
    }
    for (let i = 0; i < 6 && !(policy.model(sim1).measured && policy.model(sim2).measured); i++) await send(i)
    expect(policy.model(sim1).measured && policy.model(sim2).measured).toBe(true)
    t.nodes[2]!.setFaults({ hang: false })
    for (let i = 0; i < 100 && !sim3.available(Date.now()); i++) await Bun.sleep(20)
    for (let i = 0; i < 100 && policy.model(sim3).metricAtMs === Number.NEGATIVE_INFINITY; i++)
      await Bun.sleep(20)
    expect(policy.model(sim3).measured).toBe(false)
    // The next long prompt finds sim-3 priced at the prior, as fast as the others and idle: it is
    // served on a measured node, and sim-3 gets the prompt for one token, which measures it.
    const explored = t.svc.deps.warmups!.sentCount.explore
    const served = await send(100)
    expect(served).not.toBe('sim-3')
    expect(t.svc.deps.warmups!.sentCount.explore).toBe(explored + 1)
    for (let i = 0; i < 200 && !policy.model(sim3).measured; i++) await Bun.sleep(20)
    expect(policy.model(sim3).measured).toBe(true)
    const stats3 = t.nodes[2]!.stats()
    expect(stats3.chatRequests).toBe(1)
    expect(stats3.completionTokens).toBe(1)
    const rate = (n: NodeState) => policy.snapshot(Date.now()).find((x) => x.node === n.name)!.tokensPerSec
    expect(rate(sim3)).toBeLessThan(rate(sim1) / 2)
    // Measured slow: the next ones go to sim-1 and sim-2, with no more warm-ups.
    for (let i = 0; i < 4; i++) expect(await send(200 + i)).not.toBe('sim-3')
    expect(t.svc.deps.warmups!.sentCount.explore).toBe(explored + 1)
    const text = await (await fetch(`${t.url}/metrics`)).text()
    expect(text).toMatch(new RegExp(`^tropa_warmups_total\\{reason="explore"\\} ${explored + 1}$`, 'm'))
    expect(text).toMatch(/^tropa_warmups_failed_total\{reason="explore"\} 0$/m)
  }, 30_000)

  test('a session warm-up that fails costs the client nothing, is counted, and leaves the session where it was served', async () => {
    const { tropa, ask, holder, busy } = await busyHolder()
    t = tropa
    // Every node but the holder now answers chat requests with a 500.
    for (const n of t.nodes) if (n.name !== holder) n.setFaults({ errorRate: 1 })
    const turn1 = await ask('another conversation', { max_tokens: 2 }, { 'x-session-id': 'conv-2' })
    expect(turn1.status).toBe(200)
    await turn1.arrayBuffer()
    expect(nodeOf(turn1)).toBe(holder)
    expect(t.svc.deps.warmups!.sentCount.session).toBe(1)
    for (let i = 0; i < 100 && t.svc.deps.warmups!.failedCount.session === 0; i++) await Bun.sleep(20)
    expect(t.svc.deps.warmups!.failedCount.session).toBe(1)
    // Not warmed: the session's next turn is bound for the node that served its first.
    const policy = t.svc.deps.policy as PredictedTtft
    expect(policy.sessionHome('conv-2')?.name).toBe(holder)
    const text = await (await fetch(`${t.url}/metrics`)).text()
    expect(text).toMatch(/^tropa_warmups_failed_total\{reason="session"\} 1$/m)
    for (const r of busy) await r.body?.cancel()
  }, 30_000)
})
