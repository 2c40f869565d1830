import { describe, expect, test } from 'bun:test'
import {
  batchCostNano,
  costNano,
  formatRub,
  formatRubExact,
  nanoToRubNumber,
  parseRub,
  perMillionToPerTokenNano,
  rubNumberToNano,
} from '../../src/billing/money.ts'
import { LedgerRows } from '../../src/storage/ledger-rows.ts'
import type { LedgerEntry } from '../../src/storage/store.ts'

describe('money', () => {
  test('parseRub is exact and refuses rounding', () => {
    expect(parseRub('0.000030', 6)).toBe(30_000n)
    expect(parseRub('12.5')).toBe(12_500_000_000n)
    expect(parseRub('0.0000001', 6)).toBeUndefined()
    expect(parseRub('0.0000010', 6)).toBe(1_000n) // trailing zeros are fine
    expect(parseRub('-1')).toBeUndefined()
    expect(parseRub('1e3')).toBeUndefined()
    expect(parseRub('9007199254740993.5')).toBe(9_007_199_254_740_993_500_000_000n) // beyond 2^53
  })

  test('per-million prices must be exact at six digits per token', () => {
    expect(perMillionToPerTokenNano('30')).toBe(30_000n)
    expect(perMillionToPerTokenNano('1')).toBe(1_000n) // the smallest price: 0.000001 per token
    expect(perMillionToPerTokenNano('30.5')).toBeUndefined()
    expect(perMillionToPerTokenNano('0.5')).toBeUndefined()
  })

  test('numbers from JSON: at most six fractional digits', () => {
    expect(rubNumberToNano(12.345678)).toBe(12_345_678_000n)
    expect(rubNumberToNano(0.1)).toBe(100_000_000n)
    expect(rubNumberToNano(0.0000001)).toBeUndefined()
    expect(rubNumberToNano(-1)).toBeUndefined()
    expect(rubNumberToNano(Number.NaN)).toBeUndefined()
  })

  test('formatting rounds half up to six digits', () => {
    expect(formatRub(30_000n)).toBe('0.000030')
    expect(formatRub(500n)).toBe('0.000001')
    expect(formatRub(499n)).toBe('0.000000')
    expect(formatRub(12_500_000_000n)).toBe('12.500000')
    expect(nanoToRubNumber(1_234_567_891n)).toBe(1.234568)
  })

  test("formatting's fast path gives the bigint arithmetic's text, to the last digit", () => {
    let x = 0x9e3779b9n
    const next = () => {
      x = (x * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn
      return x
    }
    const limit = 2n ** 43n
    // Every rounding edge near the top of the fast range and near zero, then random values.
    const samples = [0n, 1n, 499n, 500n, 999_999_499n, 999_999_500n, limit - 1n, limit, limit + 1n]
    for (let d = -1500n; d <= 1500n; d++) samples.push(limit - 500_000n + d, 10n ** 12n + d)
    for (let i = 0; i < 200_000; i++) samples.push(next() % (limit + 1000n))
    for (const n of samples) expect(formatRub(n)).toBe(formatRubExact(n))
  })

  test('the JSON number of an amount is the number its six-digit text reads as', () => {
    let x = 0x2545f491n
    const next = () => {
      x = (x * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn
      return x
    }
    const samples = [
      0n,
      499n,
      500n,
      -500n,
      -501n,
      1_500n,
      10n ** 24n,
      -(10n ** 24n),
      9_007_199_254_740_991_499n,
    ]
    for (let i = 0; i < 20_000; i++) {
      const v = next() >> BigInt(Number(next() % 60n))
      samples.push(i % 3 === 0 ? -v : v)
    }
    for (const n of samples) expect(nanoToRubNumber(n)).toBe(Number(formatRub(n, 6)))
  })

  const cases: [string, { p: string; c: string }, number, number, bigint][] = [
    ['typical', { p: '0.000030', c: '0.000060' }, 1000, 200, 42_000_000n],
    ['smallest price', { p: '0.000001', c: '0.000001' }, 1, 1, 2_000n],
    ['zero tokens', { p: '0.000030', c: '0.000060' }, 0, 0, 0n],
    ['large counts', { p: '0.000030', c: '0.000060' }, 2_000_000_000, 1_000_000_000, 120_000_000_000_000n],
    ['free completion', { p: '0.000002', c: '0.000000' }, 777, 0, 1_554_000n],
  ]
  test.each(cases)('cost: %s', (_name, price, prompt, completion, expected) => {
    const p = { promptNano: parseRub(price.p, 6)!, completionNano: parseRub(price.c, 6)! }
    expect(costNano(prompt, completion, p)).toBe(expected)
  })

  test('cached prompt tokens cost the cached price; an upstream figure out of range is clamped', () => {
    const price = { promptNano: 30_000n, completionNano: 60_000n, cachedPromptNano: 15_000n }
    // 1,000 prompt tokens of which 600 cached, 10 completion tokens.
    expect(costNano(1000, 10, price, 600)).toBe(400n * 30_000n + 600n * 15_000n + 10n * 60_000n)
    expect(costNano(1000, 10, price, 0)).toBe(1000n * 30_000n + 10n * 60_000n)
    expect(costNano(1000, 10, price, 5000)).toBe(1000n * 15_000n + 10n * 60_000n) // at most the prompt
    for (const bogus of [-3, Number.NaN])
      expect(costNano(1000, 10, price, bogus)).toBe(costNano(1000, 10, price))
    expect(costNano(1000, 10, price, 600.7)).toBe(costNano(1000, 10, price, 600))
    // A price without a cached rate bills cached tokens at the prompt price.
    expect(costNano(1000, 10, { promptNano: 30_000n, completionNano: 60_000n }, 600)).toBe(
      costNano(1000, 10, price),
    )
  })

  test('batch cost is exactly half, even for one token at the smallest price', () => {
    const one = costNano(1, 0, { promptNano: 1_000n, completionNano: 0n })
    expect(batchCostNano(one)).toBe(500n)
    expect(batchCostNano(one) * 2n).toBe(one)
    expect(batchCostNano(42_000_000n)).toBe(21_000_000n)
  })
})

describe('ledger rows posted to the ledger thread', () => {
  const usage = (i: number): LedgerEntry => ({
    requestId: `r${i}`,
    kind: 'usage',
    orgId: `o${i % 3}`,
    keyId: i % 5 === 0 ? null : `k${i % 7}`,
    model: i % 11 === 0 ? null : 'm/x',
    node: `n${i % 2}`,
    promptTokens: i * 3,
    completionTokens: 2 ** 40 + i,
    costNano: BigInt(i) * 1_000_000_007n,
    batchId: i % 4 === 0 ? `batch_${i}` : null,
    startedAtMs: 1_795_000_000_000 + i,
    endedAtMs: 1_795_000_000_500 + i,
    outcome: i % 2 ? 'ok' : 'ok:capped',
    estimated: i % 3 === 0,
    cachedTokens: i % 6 === 0 ? null : i * 2,
    ttftMs: i % 5 === 1 ? null : i % 9,
    endUser: i % 3 === 0 ? null : `user ${i % 4} ∞`,
    admittedAtMs: i % 2 ? null : 1_795_000_000_000 + i,
    receiptKid: i % 3 === 1 ? null : `rk_${i % 2}`,
  })

  test('every field survives the columns and the copy to the thread, amounts exact', () => {
    const entries: LedgerEntry[] = [
      ...Array.from({ length: 1000 }, (_, i) => usage(i)),
      { ...usage(1000), costNano: 2n ** 63n - 1n },
      { ...usage(1001), kind: 'credit', keyId: null, model: null, node: null, costNano: 1n },
    ]
    const rows = new LedgerRows(4) // grows past its first capacity
    for (const e of entries) rows.push(e)
    // What the thread receives: a structured clone of the wire form.
    const received = LedgerRows.fromWire(structuredClone(rows.toWire()))
    expect(received.entries()).toEqual(entries)
    expect(LedgerRows.of(entries).entries()).toEqual(entries)
  })

  test('emptied rows are reused: only what was pushed after clear() remains', () => {
    const rows = LedgerRows.of(Array.from({ length: 40 }, (_, i) => usage(i)))
    rows.clear()
    expect(rows.length).toBe(0)
    const later = [usage(100), { ...usage(101), orgId: 'a-new-org', keyId: null }]
    for (const e of later) rows.push(e)
    expect(LedgerRows.fromWire(structuredClone(rows.toWire())).entries()).toEqual(later)
  })

  test('a refused row leaves the columns as they were: ids and amounts stay paired', () => {
    const rows = new LedgerRows()
    rows.push(usage(1))
    expect(() => rows.push({ ...usage(2), costNano: 20 as unknown as bigint })).toThrow(RangeError)
    expect(() => rows.push({ ...usage(3), orgId: null as unknown as string })).toThrow(TypeError)
    rows.push(usage(4))
    const back = LedgerRows.fromWire(structuredClone(rows.toWire())).entries()
    expect(back).toEqual([usage(1), usage(4)])
  })

  test('a failed flush puts its rows back in front of newer ones', () => {
    const failed = LedgerRows.of([usage(1), usage(2)])
    const newer = LedgerRows.of([usage(3)])
    // An id read before more rows arrive does not hide theirs (the decoded ids are re-read).
    expect(failed.requestId(1)).toBe('r2')
    failed.append(newer)
    expect(failed.requestId(2)).toBe('r3')
    expect(failed.entries().map((e) => e.requestId)).toEqual(['r1', 'r2', 'r3'])
  })

  test('an amount outside 64 bits is refused, never wrapped; request ids may hold any character', () => {
    const rows = new LedgerRows()
    expect(() => rows.push({ ...usage(1), costNano: 2n ** 63n })).toThrow(RangeError)
    expect(rows.length).toBe(0)
    expect(LedgerRows.fromWire(structuredClone(rows.toWire())).length).toBe(0)
    const odd = ['a\nb', '', 'é-😀', 'x'].map((id, i) => ({ ...usage(i), requestId: id }))
    expect(LedgerRows.fromWire(structuredClone(LedgerRows.of(odd).toWire())).entries()).toEqual(odd)
  })
})
