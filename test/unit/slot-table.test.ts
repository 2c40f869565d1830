import { edenGC, fullGC } from 'bun:jsc'
import { expect, test } from 'bun:test'
import { SlotTable } from '../../src/slot-table.ts'

test('slot table: the same members as a Set under random adds and deletes, stale deletes ignored', () => {
  let seed = 7
  const rand = () => {
    seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31
    return seed / 2 ** 31
  }
  const table = new SlotTable<{ n: number }>()
  const model = new Set<{ n: number }>()
  const slotOf = new Map<{ n: number }, number>()
  const gone: { m: { n: number }; slot: number }[] = []
  let peak = 0
  let highest = -1
  for (let i = 0; i < 20_000; i++) {
    const r = rand()
    if (r < 0.5 || model.size === 0) {
      const m = { n: i }
      const slot = table.add(m)
      expect(table.get(slot)).toBe(m)
      highest = Math.max(highest, slot)
      model.add(m)
      slotOf.set(m, slot)
    } else if (r < 0.95) {
      const members = [...model]
      const m = members[Math.floor(rand() * members.length)]!
      expect(table.delete(slotOf.get(m)!, m)).toBe(true)
      model.delete(m)
      gone.push({ m, slot: slotOf.get(m)! })
    } else if (gone.length > 0) {
      // A second delete of a member already deleted, its slot maybe another's by now: no effect.
      const g = gone[Math.floor(rand() * gone.length)]!
      expect(table.delete(g.slot, g.m)).toBe(false)
    }
    expect(table.size).toBe(model.size)
    peak = Math.max(peak, model.size)
  }
  // Freed slots are reused: the table is never longer than its busiest moment.
  expect(highest).toBe(peak - 1)
  expect(new Set(table.toArray())).toEqual(model)
  let seen = 0
  table.forEach((m, slot) => {
    expect(slotOf.get(m)).toBe(slot)
    seen++
  })
  expect(seen).toBe(model.size)
  expect(table.some((m) => m === [...model][0])).toBe(true)
  expect(table.some(() => false)).toBe(false)
  table.clear()
  expect(table.size).toBe(0)
  expect(table.toArray()).toEqual([])
})

test('slot table: members deleted from an old table are collected by the next young collection', async () => {
  // The reason the table exists (src/slot-table.ts): an old Map or Set turned over like this kept
  // dropped members reachable through its next young collections (in Bun 1.4.5, 16 of 39 here).
  const table = new SlotTable<{ payload: number[] }>()
  for (let i = 0; i < 8; i++) {
    const o = { payload: [] }
    table.delete(table.add(o), o)
  }
  fullGC() // the table is old now, as a router's are
  const refs: WeakRef<object>[] = []
  const open: { o: { payload: number[] }; slot: number }[] = []
  for (let i = 0; i < 2_000; i++) {
    const o = { payload: new Array(20).fill(i) }
    if (i % 50 === 0) refs.push(new WeakRef(o))
    open.push({ o, slot: table.add(o) })
    if (open.length > 16) {
      const x = open.shift()!
      table.delete(x.slot, x.o)
    }
  }
  // The last ones leave with nothing added after them: their slots stay free, and must let go.
  const last = open.splice(0, 8)
  for (const x of last) table.delete(x.slot, x.o)
  const lastRefs = last.map((x) => new WeakRef(x.o))
  last.length = 0
  await Bun.sleep(0) // WeakRef targets are kept until the job that made them ends
  edenGC()
  // The last sampled member is still open; every other was deleted.
  const alive = refs.slice(0, -1).filter((r) => r.deref() !== undefined).length
  expect(alive).toBe(0)
  expect(lastRefs.filter((r) => r.deref() !== undefined).length).toBe(0)
  expect(table.size).toBe(8)
})
