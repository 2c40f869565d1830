import { expect, test } from 'bun:test'
import { measureEventLoopMoneyPath } from '../../bench/money-loop.ts'

test("bench:money's in-process part runs the real money path: every billed call is in the ledger", async () => {
  // It throws when the ledger rows written differ from the billed calls made. (Its CPU figures
  // come in 10 ms clock ticks: at this size they may read 0, so only their form is checked.)
  const r = await measureEventLoopMoneyPath(1, 5_000)
  expect(Number.isFinite(r.onUs) && r.onUs >= 0).toBe(true)
  expect(Number.isFinite(r.offUs) && r.offUs >= 0).toBe(true)
})
