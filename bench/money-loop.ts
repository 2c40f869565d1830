/**
 * The money path's cost on the event loop, measured apart from everything else: the calls a
 * request makes with billing on (reserve the worst case, settle the real cost, queue the ledger
 * row; every 250 ms a flush hands the rows to the ledger thread) against the same calls with
 * billing off, in one process, alternating. CPU time of this thread only (the ledger thread
 * writes the rows on its own thread, measured in the router by `bun run bench:money`).
 */
import { mkdtempSync } from 'node:fs'
import os from 'node:os'
import { join, resolve } from 'node:path'
import { LedgerWriter } from '../src/billing/ledger.ts'
import { ThreadLedgerSink } from '../src/billing/ledger-sink.ts'
import { Meter, type Reservation } from '../src/billing/meter.ts'
import { costNano, formatRub } from '../src/billing/money.ts'
import { LiveKey, LiveOrg } from '../src/identity/live.ts'
import { requestId } from '../src/ids.ts'
import { openSqliteStore } from '../src/storage/sqlite/store.ts'
import { cpuUs } from './proc.ts'

export interface EventLoopMoneyCost {
  /** Event-loop CPU per request, microseconds (medians over rounds). */
  readonly onUs: number
  readonly offUs: number
  readonly rounds: number
  readonly requestsPerRound: number
}

export async function measureEventLoopMoneyPath(
  rounds = 9,
  requestsPerRound = 300_000,
): Promise<EventLoopMoneyCost> {
  const dir = mkdtempSync(join(os.tmpdir(), 'tropa-money-loop-'))
  const path = join(dir, 'tropa.db')
  const store = openSqliteStore(path)
  const org = new LiveOrg({ id: 'org_bench', name: 'bench', balanceNano: 10n ** 17n, createdAt: 0 })
  await store.insertOrg({ id: org.id, name: org.name, balanceNano: org.balanceNano, createdAt: 0 })
  const key = new LiveKey({
    id: 'key_bench',
    orgId: org.id,
    kind: 'api',
    secretHash: 'x',
    hint: 'x',
    createdAt: 0,
    name: 'bench',
    status: 'active',
    limitNano: 10n ** 16n,
    spentNano: 0n,
    lastUsedAt: null,
    revokedAt: null,
    rpmLimit: null,
    tpmLimit: null,
    expiresAt: null,
    models: null,
    maxConcurrency: null,
    budget: null,
    endUserBudget: null,
  })
  await store.insertKey({ ...key, revokedAt: null })
  const entry = resolve(import.meta.dir, '../src/billing/ledger-thread.ts')
  const writer = new LedgerWriter(new ThreadLedgerSink(path, entry), 50, (e) => console.error(e))
  const on = new Meter(writer, true)
  const off = new Meter(new LedgerWriter(new ThreadLedgerSink(path, entry), 50, () => {}), false)
  const price = { promptNano: 30_000n, completionNano: 60_000n }
  // One request's money calls, as chat.ts makes them (the parts billing off skips included).
  const request = (meter: Meter) => {
    const started = Date.now()
    // A key without a budget: the meter answers at once (no promise).
    const r = meter.reserve(key, org, costNano(12, 4084, price)) as Reservation
    const charged = meter.settle(r, {
      requestId: requestId(),
      model: 'sim/chat-small',
      node: 'fast-1',
      promptTokens: 12,
      completionTokens: 16,
      costNano: costNano(12, 16, price),
      batchId: null,
      startedAtMs: started,
      endedAtMs: Date.now(),
      outcome: 'ok',
      estimated: false,
    })
    return formatRub(charged)
  }
  const perRound: Record<'on' | 'off', number[]> = { on: [], off: [] }
  // About what one flush interval (storage.flush_interval_ms, 250 ms) holds at 13,000 requests per second.
  const perFlush = 3250
  const run = async (which: 'on' | 'off') => {
    const meter = which === 'on' ? on : off
    const before = cpuUs(process.pid, process.pid)
    for (let i = 0; i < requestsPerRound; i++) {
      request(meter)
      // As in the router: a flush starts and the loop goes on; the thread's answer arrives later.
      // (Awaiting it here would measure Bun's wait for the thread, which spins.)
      if (i % perFlush === perFlush - 1) {
        void writer.flush()
        await new Promise((r) => setImmediate(r))
      }
    }
    perRound[which].push((cpuUs(process.pid, process.pid) - before) / requestsPerRound)
    await writer.flush()
  }
  await run('on')
  await run('off')
  for (let i = 0; i < rounds; i++)
    for (const w of i % 2 ? (['off', 'on'] as const) : (['on', 'off'] as const)) await run(w)
  await writer.stop()
  // Every billed call left its row: the loop measured the real path, not a broken one.
  const written = (await store.ledgerForOrg(org.id, 0, Date.now() + 1000)).length
  await store.close()
  const billed = (rounds + 1) * requestsPerRound // a warm-up run, then one per round
  if (written !== billed) throw new Error(`money-loop: ${written} ledger rows for ${billed} billed calls`)
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
  return { onUs: median(perRound.on), offUs: median(perRound.off), rounds, requestsPerRound }
}

if (import.meta.main) {
  const r = await measureEventLoopMoneyPath()
  console.log(
    `money path on the event loop: ${(r.onUs - r.offUs).toFixed(2)} us per request (${r.onUs.toFixed(2)} on, ${r.offUs.toFixed(2)} off; median of ${r.rounds} rounds of ${r.requestsPerRound})`,
  )
}
