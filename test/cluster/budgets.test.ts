import { afterAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { periodAt } from '../../src/billing/budgets.ts'
import { costNano, nanoToRubNumber, parseRub, rubNumberToNano } from '../../src/billing/money.ts'
import { countChatPrompt, loadTokenizer, reservedPromptTokens } from '../../src/pipeline/tokens.ts'
import { startSimFleet } from '../../src/simulator/index.ts'
import { call } from '../helpers/cluster.ts'
import { clusterConfig, startNode } from '../helpers/infra.ts'
import { freshPgDatabase } from '../helpers/pg.ts'
import { freePort, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN, CHAT_PRICE } from '../helpers/start.ts'

// The money test of issue #23 for budgets: 300 concurrent requests over three nodes (one a
// separate process, killed with SIGKILL mid-run) on a key with a daily budget and a daily budget
// per end user, across the day's boundary (every node's budget clock runs ahead of the real one,
// so the boundary falls a few seconds into the test), with clients that leave mid-stream. Per
// period and per end user the spend never exceeds its budget; the ledger, the key's recorded
// spend and the balance agree to the nano-rouble.
const REDIS_URL = process.env.TROPA_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'
const LEASE_MS = 1000
const TZ = 'Europe/Moscow'
const dir = mkdtempSync(join(tmpdir(), 'tropa-budgets-'))
const fleet = await startSimFleet(
  [1, 2].map((i) => ({ name: `sim-${i}`, itlMs: 3, iterationOverheadMs: 1, seed: i })),
)
const pg = await freshPgDatabase()
afterAll(async () => {
  await fleet.stop()
  await pg.drop()
  rmSync(dir, { recursive: true, force: true })
})

const messages = [{ role: 'user' as const, content: 'Count to twenty, please.' }]
const MAX = 20
const USERS = 5

test('300 requests on 3 nodes across a budget period boundary, disconnects and a kill -9: per period and per end user never over; ledger = spent = balance drop', async () => {
  await loadTokenizer()
  const price = {
    promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
    completionNano: parseRub(CHAT_PRICE.completion, 6)!,
  }
  const worst = costNano(reservedPromptTokens(countChatPrompt(messages, undefined)), MAX, price)
  const budget = worst * 24n
  const userBudget = worst * 8n

  // The nodes' clock: the end of today in Moscow falls BOUNDARY_IN_MS of real time from now.
  const BOUNDARY_IN_MS = 8000
  const day = periodAt('day', TZ, Date.now())
  const offset = day.endMs - (Date.now() + BOUNDARY_IN_MS)
  const boundaryReal = day.endMs - offset
  const clock = () => Date.now() + offset

  const cfg = clusterConfig({
    dir,
    pgUrl: pg.url,
    redisUrl: REDIS_URL,
    sim: fleet.nodes,
    redis: { reservation_lease_ms: LEASE_MS },
  })
  const a = await startRouterProcess(cfg.path, freePort(), { TROPA_TEST_CLOCK_OFFSET_MS: String(offset) })
  const b = await startNode(cfg.path, { clock })
  const c = await startNode(cfg.path, { clock })
  try {
    const org = (await (
      await call(b.url, '/v1/admin/organizations', ADMIN_TOKEN, { name: 'budgets', balance_rub: 1000 })
    ).json()) as { id: string; master_key: string }
    const created = await call(c.url, '/v1/keys', org.master_key, {
      name: 'daily',
      budget: { amount_rub: nanoToRubNumber(budget), period: 'day', timezone: TZ },
      end_user_budget: { amount_rub: nanoToRubNumber(userBudget), period: 'day', timezone: TZ },
    })
    expect(created.status).toBe(201)
    const key = (await created.json()) as { key: string; key_id: string }
    await Bun.sleep(100) // the new key's event reaches every node

    // Requests start every 10 ms from 1.5 s before the boundary: half before it, half after.
    const wait = boundaryReal - 1500 - Date.now()
    expect(wait).toBeGreaterThan(0)
    await Bun.sleep(wait)
    const nodes = [a.url, b.url, c.url]
    const codes: string[] = []
    let lost = 0
    const killAt = boundaryReal + 400
    const killed = (async () => {
      await Bun.sleep(killAt - Date.now())
      a.proc.kill('SIGKILL')
      await a.proc.exited
    })()
    const results = await Promise.all(
      Array.from({ length: 300 }, async (_, i) => {
        await Bun.sleep(i * 10)
        // user-0 sends half the requests (so its own budget binds), four others the rest.
        const user = i % 2 === 0 ? 'user-0' : `user-${1 + ((i >> 1) % (USERS - 1))}`
        const stream = i % 2 === 1
        const body = {
          model: 'test/chat',
          messages,
          max_tokens: MAX,
          stream,
          seed: i,
          // Half name the end user in the body, half in the header.
          ...(i % 4 < 2 && { user }),
        }
        try {
          const res = await fetch(`${nodes[i % 3]}/v1/chat/completions`, {
            method: 'POST',
            headers: {
              authorization: `Bearer ${key.key}`,
              'content-type': 'application/json',
              ...(i % 4 >= 2 && { 'x-tropa-end-user': user }),
            },
            body: JSON.stringify(body),
          })
          if (res.status === 402) codes.push(((await res.json()) as { error: { code: string } }).error.code)
          else if (stream && res.status === 200 && i % 10 === 1) {
            // A client that leaves after its first chunk.
            await res.body!.getReader().read()
            await res.body!.cancel().catch(() => {})
          } else await res.arrayBuffer()
          return res.status
        } catch {
          lost++ // the killed node's connections
          return 0
        }
      }),
    )
    await killed
    // The killed node's holds come back after its lease; the others flush what they settled.
    await Bun.sleep(LEASE_MS * 2)
    for (const n of [b, c]) await n.svc.ledger.flush()

    const ok = results.filter((s) => s === 200).length
    const refused = results.filter((s) => s === 402).length
    expect(ok + refused + lost).toBe(300)
    expect(results.every((s) => s === 0 || s === 200 || s === 402)).toBe(true)
    expect(codes).toContain('key_budget_exhausted')
    expect(codes).toContain('end_user_budget_exhausted')
    expect(codes.every((x) => x === 'key_budget_exhausted' || x === 'end_user_budget_exhausted')).toBe(true)

    const store = b.svc.store
    const rows = (await store.ledgerForOrg(org.id, 0, Date.now() + 60_000)).filter(
      (r) => r.kind === 'usage' && r.keyId === key.key_id,
    )
    expect(rows.length).toBeGreaterThan(0)
    const spentIn = new Map<string, bigint>()
    const add = (id: string, n: bigint) => spentIn.set(id, (spentIn.get(id) ?? 0n) + n)
    for (const r of rows) {
      expect(r.admittedAtMs).not.toBeNull()
      expect(r.endUser).toMatch(/^user-\d$/)
      const period = r.admittedAtMs! < day.endMs ? 'before' : 'after'
      add(period, r.costNano)
      add(`${period} ${r.endUser}`, r.costNano)
    }
    // Both periods admitted requests, and neither went over; nor did any end user in either.
    expect(spentIn.get('before') ?? 0n).toBeGreaterThan(0n)
    expect(spentIn.get('after') ?? 0n).toBeGreaterThan(0n)
    for (const [id, spent] of spentIn)
      expect(spent).toBeLessThanOrEqual(id.includes(' ') ? userBudget : budget)

    // The ledger, the key's recorded spend and the balance agree to the nano-rouble.
    const sum = rows.reduce((s, r) => s + r.costNano, 0n)
    expect((await store.getKey(key.key_id))!.spentNano).toBe(sum)
    expect(1_000_000_000_000n - (await store.getOrg(org.id))!.balanceNano).toBe(sum)

    // Every node shows today's (the new day's) period: nothing held any more, its spend within the
    // budget and at least what the ledger holds for it (a charge the killed node settled in Redis
    // but had not written yet counts there, never the other way).
    const views = await Promise.all(
      [b.url, c.url].map(async (u) => {
        const res = await call(u, `/v1/keys/${key.key_id}`, org.master_key)
        return (await res.json()) as {
          budget: { spent_rub: number; reserved_rub: number; resets_at: number; period_start: number }
        }
      }),
    )
    for (const v of views) {
      expect(v.budget.period_start).toBe(day.endMs / 1000)
      expect(v.budget.resets_at).toBe(periodAt('day', TZ, day.endMs).endMs / 1000)
      expect(v.budget.reserved_rub).toBe(0)
      const shown = rubNumberToNano(v.budget.spent_rub)!
      expect(shown).toBeGreaterThanOrEqual(spentIn.get('after')!)
      expect(shown).toBeLessThanOrEqual(budget)
    }
    expect(views[0]!.budget.spent_rub).toBe(views[1]!.budget.spent_rub)
    console.log(
      `budgets over three nodes: ${ok} answered, ${refused} refused (${codes.filter((x) => x === 'key_budget_exhausted').length} key budget, ${codes.filter((x) => x === 'end_user_budget_exhausted').length} end user), ${lost} lost with the killed node; spent ${nanoToRubNumber(spentIn.get('before') ?? 0n)} before and ${nanoToRubNumber(spentIn.get('after') ?? 0n)} after the boundary, of ${nanoToRubNumber(budget)} RUB a day`,
    )
  } finally {
    a.proc.kill('SIGKILL')
    await b.stop()
    await c.stop()
  }
}, 60_000)
