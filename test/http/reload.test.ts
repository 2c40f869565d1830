import { afterEach, describe, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { batchCostNano, costNano, parseRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { Log } from '../../src/services.ts'
import { type SimNode, startSimFleet } from '../../src/simulator/index.ts'
import { startChatBatch } from '../helpers/batches.ts'
import { usageRows } from '../helpers/ledger.ts'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN, CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// Hot reload of models, routes and prices (POST /v1/admin/reload; SIGHUP calls the same code):
// nothing dropped, prices from the next admitted request on, an invalid file refused whole.

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const NEW_PRICE = { prompt: '0.000040', completion: '0.000090' }
const priceOf = (p: { prompt: string; completion: string }) => ({
  promptNano: parseRub(p.prompt, 6)!,
  completionNano: parseRub(p.completion, 6)!,
})

/** test/chat on the given nodes at the given price. */
const chatModel = (nodes: readonly Pick<SimNode, 'name' | 'url'>[], pricing = CHAT_PRICE): ModelFile => ({
  id: 'test/chat',
  owned_by: 'test',
  kind: 'chat',
  context_length: 4096,
  pricing,
  routes: nodes.map((n) => ({
    name: n.name,
    base_url: n.url,
    upstream_model: 'chat-up',
    max_concurrency: 64,
  })),
})

/** Rewrites the running Tropa's config file with other models. */
function rewriteModels(tropa: Tropa, models: unknown) {
  const path = join(tropa.dir, 'tropa.json')
  const file = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>
  writeFileSync(path, JSON.stringify({ ...file, models }))
}

const reload = (tropa: Tropa) => tropa.admin('/v1/admin/reload', undefined, 'POST')

const body = (i: number, stream: boolean) =>
  JSON.stringify({
    model: 'test/chat',
    messages: [{ role: 'user', content: `request ${i}` }],
    max_tokens: 8,
    stream,
  })

describe('POST /v1/admin/reload', () => {
  test('1,000 requests through two reloads: none dropped; a removed node drains, an added one serves; each row billed at its price', async () => {
    t = await startTropa({
      nodes: [1, 2, 3].map((i) => ({ name: `sim-${i}`, seed: i, timeScale: 1, itlMs: 2 })),
      models: (nodes) => [chatModel(nodes.slice(0, 2))],
    })
    const tropa = t
    const kept = tropa.svc.deps.pool.nodes.get(tropa.nodes[1]!.url)!
    const N = 1000
    let started = 0
    let finished = 0
    const results: { status: number; done: boolean; afterReload: boolean; requestId: string }[] = []
    let reloadedAt = Number.POSITIVE_INFINITY
    let reloads: Promise<void> | undefined
    const worker = async () => {
      while (started < N) {
        const i = started++
        const stream = i % 2 === 0
        const afterReload = Date.now() > reloadedAt
        const res = await tropa.fetch('/v1/chat/completions', { method: 'POST', body: body(i, stream) })
        const text = await res.text()
        results.push({
          status: res.status,
          done: stream ? text.endsWith('data: [DONE]\n\n') : text.includes('"choices"'),
          afterReload,
          requestId: res.headers.get('x-request-id')!,
        })
        if (++finished === 300)
          reloads = (async () => {
            // sim-1 out, sim-3 in, a new price: while requests run on every node.
            rewriteModels(tropa, [chatModel(tropa.nodes.slice(1, 3), NEW_PRICE)])
            const r1 = await reload(tropa)
            expect(r1.status).toBe(200)
            reloadedAt = Date.now()
            const report = (await r1.json()) as Record<string, unknown>
            expect(report).toMatchObject({
              object: 'config.reload',
              models: ['test/chat'],
              models_changed: ['test/chat'],
              nodes_added: ['sim-3'],
              nodes_removed: ['sim-1'],
              restart_needed: [],
            })
            // The same file again: nothing to do, nothing dropped either.
            const r2 = await reload(tropa)
            expect(((await r2.json()) as { models_changed: string[] }).models_changed).toEqual([])
          })()
      }
    }
    await Promise.all(Array.from({ length: 16 }, worker))
    await reloads
    expect(results).toHaveLength(N)
    expect(results.filter((r) => r.status !== 200 || !r.done)).toEqual([])

    // sim-1 was drained: its requests finished, none came after. sim-3 took over.
    const pool = tropa.svc.deps.pool
    expect(pool.nodes.has(tropa.nodes[0]!.url)).toBe(false)
    expect(tropa.nodes[2]!.stats().chatRequests).toBeGreaterThan(0)
    // The node that stayed is the same state (what was learned of it is kept).
    expect(pool.nodes.get(tropa.nodes[1]!.url)).toBe(kept)
    expect(kept.inFlight).toBe(0)

    const rows = await usageRows(tropa)
    expect(rows).toHaveLength(N)
    const byId = new Map(rows.map((r) => [r.requestId, r]))
    const oldPrice = priceOf(CHAT_PRICE)
    const newPrice = priceOf(NEW_PRICE)
    let atNew = 0
    for (const r of results) {
      const row = byId.get(r.requestId)!
      const old = costNano(row.promptTokens, row.completionTokens, oldPrice)
      const next = costNano(row.promptTokens, row.completionTokens, newPrice)
      // Admitted after the reload answered: the new price, exactly; before it: either.
      if (r.afterReload) expect(row.costNano).toBe(next)
      else expect([old, next]).toContain(row.costNano)
      if (row.costNano === next) atNew++
      if (row.node === 'sim-1') expect(r.afterReload).toBe(false)
    }
    expect(atNew).toBeGreaterThan(0)
    expect(atNew).toBeLessThan(N)
  }, 60_000)

  test('a price change applies from the next admitted request, to the nano-rouble; a stream admitted before keeps its price', async () => {
    t = await startTropa({
      nodes: [{ name: 'slow', seed: 1, timeScale: 1, itlMs: 40 }],
      models: (nodes) => [chatModel(nodes)],
    })
    const tropa = t
    // A stream admitted before the reload, still running when it happens.
    const before = tropa.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'before' }],
        max_tokens: 30,
        stream: true,
      }),
    })
    const res = await before
    const beforeId = res.headers.get('x-request-id')!
    const beforeText = res.text()
    rewriteModels(tropa, [chatModel(tropa.nodes, NEW_PRICE)])
    expect((await reload(tropa)).status).toBe(200)
    expect((await beforeText).endsWith('data: [DONE]\n\n')).toBe(true)
    // The catalogue shows the new price.
    const models = (await (await tropa.fetch('/v1/models')).json()) as {
      data: { id: string; pricing: { prompt: string; completion: string; cached_prompt: string } }[]
    }
    expect(models.data.find((m) => m.id === 'test/chat')!.pricing).toEqual({
      ...NEW_PRICE,
      cached_prompt: NEW_PRICE.prompt,
    })
    const after = await tropa.client().chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'after' }],
      max_tokens: 5,
    })
    const rows = await usageRows(tropa)
    const rowBefore = rows.find((r) => r.requestId === beforeId)!
    const rowAfter = rows.find((r) => r.requestId !== beforeId)!
    expect(rowBefore.costNano).toBe(
      costNano(rowBefore.promptTokens, rowBefore.completionTokens, priceOf(CHAT_PRICE)),
    )
    expect(rowAfter.promptTokens).toBe(after.usage!.prompt_tokens)
    expect(rowAfter.costNano).toBe(
      costNano(rowAfter.promptTokens, rowAfter.completionTokens, priceOf(NEW_PRICE)),
    )
    expect(parseRub(String((after.usage as { cost_rub?: number }).cost_rub), 6)).toBe(rowAfter.costNano)
    expect(rowAfter.costNano).not.toBe(
      costNano(rowAfter.promptTokens, rowAfter.completionTokens, priceOf(CHAT_PRICE)),
    )
  }, 30_000)

  test('an invalid file is refused with every error, in the answer and the log, and the old config keeps serving', async () => {
    const lines: { msg: string; fields?: Record<string, unknown> }[] = []
    const log: Log = (_level, msg, fields) => void lines.push({ msg, fields })
    t = await startTropa({ log })
    const tropa = t
    const models = (
      JSON.parse(readFileSync(join(tropa.dir, 'tropa.json'), 'utf8')) as { models: ModelFile[] }
    ).models
    // Three problems: a price not exact at six digits, a fallback that is no model, a bad URL.
    rewriteModels(tropa, [
      { ...models[0]!, pricing: { prompt: '0.0000301', completion: '0.000060' }, fallbacks: ['test/none'] },
      { ...models[1]!, routes: [{ ...models[1]!.routes![0]!, base_url: 'ftp://nowhere' }] },
    ])
    const res = await reload(tropa)
    expect(res.status).toBe(400)
    const { error } = (await res.json()) as { error: { code: string; message: string; type: string } }
    expect(error.code).toBe('invalid_config')
    expect(error.type).toBe('invalid_request_error')
    expect(error.message).toContain('pricing.prompt 0.0000301 is not exact')
    expect(error.message).toContain('names test/none as a fallback')
    expect(error.message).toContain('"ftp://nowhere" is not an http(s) URL')
    const logged = lines.find((l) => l.msg === 'config reload refused; the running config stays')
    expect(logged).toBeDefined()
    expect((logged!.fields!.problems as string[]).length).toBe(3)

    // Still the old models and prices.
    const list = (await (await tropa.fetch('/v1/models')).json()) as {
      data: { id: string; pricing: { prompt: string } }[]
    }
    expect(list.data.find((m) => m.id === 'test/chat')!.pricing.prompt).toBe(CHAT_PRICE.prompt)
    const answer = await tropa.client().chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 5,
    })
    const [row] = await usageRows(tropa)
    expect(row!.costNano).toBe(
      costNano(answer.usage!.prompt_tokens, answer.usage!.completion_tokens, priceOf(CHAT_PRICE)),
    )

    // An unknown key, and a file that does not parse at all: refused the same way.
    rewriteModels(tropa, [{ ...models[0]!, colour: 'blue' }])
    const unknown = await reload(tropa)
    expect(unknown.status).toBe(400)
    expect(((await unknown.json()) as { error: { message: string } }).error.message).toContain('colour')
    writeFileSync(join(tropa.dir, 'tropa.json'), '{ "models": [')
    const broken = await reload(tropa)
    expect(broken.status).toBe(400)
    expect(((await broken.json()) as { error: { message: string } }).error.message).toContain('cannot parse')
  })

  test('batch lines admitted after a reload are billed at the new price (workers already running too)', async () => {
    t = await startTropa({ models: (nodes) => [chatModel(nodes)] })
    const tropa = t
    const client = tropa.client()
    const balance = tropa.svc.identity.org(tropa.orgId).balanceNano
    const runBatch = async () => {
      const batch = await startChatBatch(client, 3)
      let done = batch
      for (let i = 0; i < 250 && done.status !== 'completed'; i++) {
        await Bun.sleep(20)
        done = await client.batches.retrieve(batch.id)
      }
      expect(done.status).toBe('completed')
      const rows = (await usageRows(tropa)).filter((r) => r.batchId === batch.id)
      expect(rows).toHaveLength(3)
      return rows
    }
    const at =
      (p: { prompt: string; completion: string }) =>
      (r: { promptTokens: number; completionTokens: number }) =>
        batchCostNano(costNano(r.promptTokens, r.completionTokens, priceOf(p)))
    // The first batch starts the worker threads at the old price.
    const before = await runBatch()
    for (const r of before) expect(r.costNano).toBe(at(CHAT_PRICE)(r))
    rewriteModels(tropa, [chatModel(tropa.nodes, NEW_PRICE)])
    expect((await reload(tropa)).status).toBe(200)
    const after = await runBatch()
    for (const r of after) expect(r.costNano).toBe(at(NEW_PRICE)(r))
    // The live balance moved by the rows' sum (a worker writes a line's row, the main thread its spend).
    const sum = [...before, ...after].reduce((a, r) => a + r.costNano, 0n)
    expect(tropa.svc.identity.org(tropa.orgId).balanceNano).toBe(balance - sum)
  }, 30_000)

  test('only the admin token may reload', async () => {
    t = await startTropa()
    const asKey = await t.fetch('/v1/admin/reload', { method: 'POST' })
    expect(asKey.status).toBe(403)
    const asMaster = await t.fetch('/v1/admin/reload', { method: 'POST', key: t.masterKey })
    expect(asMaster.status).toBe(403)
    const asAdmin = await t.fetch('/v1/admin/reload', { method: 'POST', key: ADMIN_TOKEN })
    expect(asAdmin.status).toBe(200)
  })
})

describe('SIGHUP', () => {
  test('a router process reloads its file on SIGHUP; an invalid one leaves it serving as before', async () => {
    const fleet = await startSimFleet([{ name: 'sim-1', seed: 1, timeScale: 0 }])
    const dir = mkdtempSync(join(tmpdir(), 'tropa-hup-'))
    const config = join(dir, 'tropa.json')
    const write = (models: unknown) =>
      writeFileSync(
        config,
        JSON.stringify({ server: { data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'info' }, models }),
      )
    write([chatModel(fleet.nodes)])
    const { proc, url } = await startRouterProcess(config, freePort())
    const org = await jsonCall(url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'hup', balance_rub: 10 })
    const key = await jsonCall(url, '/v1/keys', org.master_key as string, { name: 'hup' })
    const price = async () => {
      const list = (await jsonCall(url, '/v1/models', key.key as string)) as {
        data: { id: string; pricing: { prompt: string } }[]
      }
      return list.data.find((m) => m.id === 'test/chat')!.pricing.prompt
    }
    try {
      expect(await price()).toBe(CHAT_PRICE.prompt)
      write([chatModel(fleet.nodes, NEW_PRICE)])
      proc.kill('SIGHUP')
      for (let i = 0; i < 100 && (await price()) !== NEW_PRICE.prompt; i++) await Bun.sleep(20)
      expect(await price()).toBe(NEW_PRICE.prompt)
      write([{ ...chatModel(fleet.nodes), pricing: { prompt: 'x', completion: '0.000060' } }])
      proc.kill('SIGHUP')
      await Bun.sleep(300)
      expect(proc.exitCode).toBeNull()
      expect(await price()).toBe(NEW_PRICE.prompt)
    } finally {
      proc.kill('SIGTERM')
      await proc.exited
      await fleet.stop()
      rmSync(dir, { recursive: true, force: true })
    }
    const stderr = await new Response(proc.stderr).text()
    expect(stderr).toContain('config reloaded')
    expect(stderr).toContain('config reload refused; the running config stays')
  }, 30_000)
})
