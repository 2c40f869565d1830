import { expect, test } from 'bun:test'
import { randomBase62, requestId, sortableId } from '../../src/ids.ts'

test('request ids: 24 base62 characters, unique, in time order, the random part uniform', () => {
  const n = 200_000
  const ids = new Set<string>()
  const counts = new Map<string, number>()
  const start = 1_795_000_000_000
  let previous = ''
  for (let i = 0; i < n; i++) {
    // A new millisecond every 50 ids: the prefix changes, the order must follow it.
    const id = requestId(start + Math.floor(i / 50))
    expect(id.length).toBe(24)
    ids.add(id)
    if (i % 50 === 0) {
      expect(id > previous).toBe(true)
      previous = id
    }
    for (const c of id.slice(8)) counts.set(c, (counts.get(c) ?? 0) + 1)
  }
  expect(ids.size).toBe(n)
  expect([...ids].every((id) => /^[0-9A-Za-z]{24}$/.test(id))).toBe(true)
  expect(counts.size).toBe(62)
  const expected = (n * 16) / 62
  for (const c of counts.values()) expect(Math.abs(c / expected - 1)).toBeLessThan(0.05)
})

test('secrets and record ids keep their shapes', () => {
  expect(randomBase62(43)).toMatch(/^[0-9A-Za-z]{43}$/)
  const a = sortableId(1_795_000_000_000)
  const b = sortableId(1_795_000_000_000)
  expect(a).toMatch(/^[0-9a-z]{26}$/)
  expect(b > a).toBe(true)
})
