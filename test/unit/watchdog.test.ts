import { expect, test } from 'bun:test'
import { OpenStreams } from '../../src/pipeline/drain.ts'
import { Watchdog } from '../../src/upstream/watchdog.ts'

test('watchdog: due deadlines fire once; one cleared or moved on by an earlier callback does not', async () => {
  const w = new Watchdog(5)
  const fired: string[] = []
  const now = Date.now()
  // All three are due at the same sweep, which visits them in the order they were set (a fresh
  // watchdog's slots): the first clears the second and moves the third on.
  const slots: { second?: ReturnType<Watchdog['watch']>; third?: ReturnType<Watchdog['watch']> } = {}
  w.watch(now + 10, () => {
    fired.push('first')
    if (slots.second) w.clear(slots.second)
    if (slots.third) slots.third.atMs = Date.now() + 60_000
  })
  slots.second = w.watch(now + 10, () => fired.push('second'))
  slots.third = w.watch(now + 10, () => fired.push('third'))
  const later = w.watch(now + 40, () => fired.push('later'))
  // (a loaded machine's sweep may come late: wait for the last one, up to 2 s)
  for (let i = 0; i < 200 && !fired.includes('later'); i++) await Bun.sleep(10)
  expect(fired).toEqual(['first', 'later'])
  // Fired deadlines are gone: clearing one again changes nothing, and nothing fires twice.
  w.clear(later)
  await Bun.sleep(30)
  expect(fired).toEqual(['first', 'later'])
  w.stop()
})

test('open streams: endAll ends each once; the ends deleting themselves meanwhile change nothing', () => {
  const streams = new OpenStreams()
  const ended: number[] = []
  const slots: number[] = []
  for (let i = 0; i < 5; i++) {
    const end = () => {
      ended.push(i)
      streams.delete(slots[i]!, end)
    }
    slots.push(streams.add(end))
  }
  const gone = () => ended.push(99)
  streams.delete(streams.add(gone), gone)
  expect(streams.size).toBe(5)
  expect(streams.endAll()).toBe(5)
  expect(ended.sort()).toEqual([0, 1, 2, 3, 4])
  expect(streams.size).toBe(0)
  // A stream added after endAll is not freed by an old slot of another.
  const late = () => ended.push(7)
  const slot = streams.add(late)
  streams.delete(slots[0]!, () => {})
  expect(streams.size).toBe(1)
  streams.delete(slot, late)
  expect(streams.size).toBe(0)
})
