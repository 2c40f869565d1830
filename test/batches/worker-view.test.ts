import { expect, test } from 'bun:test'
import { type BatchView, type NodeReport, PrimaryNodes, WorkerNodes } from '../../src/workers/nodes.ts'
import { routeFleet } from '../helpers/fleet.ts'

// The exchange of src/workers/nodes.ts between a primary and two workers, each with the node pool
// of its own process, the channel a queue delivered in order (test/batches/workers-yield.test.ts
// runs it over real processes).
test("each worker's routing sees the other workers' interactive requests per node, and the primary's lines", async () => {
  const primary = routeFleet(2, 4)
  const workers = [routeFleet(2, 4), routeFleet(2, 4)]
  let wanting = true
  const toWorkers: BatchView[] = []
  const mirror = new PrimaryNodes(
    primary.pool,
    () => wanting,
    (v) => toWorkers.push(v),
  )
  const sides = workers.map(
    (w, i) => new WorkerNodes(w.pool, (nodes: NodeReport[]) => mirror.report(i, nodes)),
  )
  const deliver = async () => {
    for (let round = 0; round < 4; round++) {
      await new Promise((r) => setImmediate(r))
      for (const v of toWorkers.splice(0)) for (const s of sides) s.apply(v)
    }
  }
  // A batch wants nodes; one of its lines (of 900 prompt tokens) runs on n0.
  primary.pool.beginBatch(primary.cands[0]!.node, 900, 5000)
  await deliver()
  // Every worker's routing counts the line's prefill on n0 (routing/predicted.ts), as the primary's does.
  for (const w of workers) {
    expect(w.cands[0]!.node.batchStarts).toEqual([{ atMs: 5000, tokens: 900 }])
    expect(w.cands[1]!.node.batchStarts).toEqual([])
  }
  // Worker 0 serves two requests on n1, worker 1 one on n0.
  const [w0, w1] = workers
  w0!.pool.begin(w0!.cands[1]!.node)
  w0!.pool.begin(w0!.cands[1]!.node)
  w1!.pool.begin(w1!.cands[0]!.node)
  await deliver()
  // The primary counts all three; its line on n0 met worker 1's request there and was pre-empted
  // by the scheduler in a real process (here: the mirror told the pool of a request on it).
  expect(primary.cands.map((c) => c.node.remoteInteractive)).toEqual([1, 2])
  // Each worker: its own requests as before, the other worker's as remote, the primary's line.
  expect(w0!.cands.map((c) => [c.node.interactiveInFlight, c.node.remoteInteractive])).toEqual([
    [0, 1],
    [2, 0],
  ])
  expect(w1!.cands.map((c) => [c.node.interactiveInFlight, c.node.remoteInteractive])).toEqual([
    [1, 0],
    [0, 2],
  ])
  expect(w1!.cands[0]!.node.batchInFlight).toBe(1)
  // n1 is not quiet for worker 1, though it serves nothing there itself.
  expect(w1!.cands[1]!.node.quiet(Date.now(), 0)).toBe(false)
  // Requests end; worker 1 dies with nothing in flight: every count back to zero.
  w0!.pool.end(w0!.cands[1]!.node, true)
  w0!.pool.end(w0!.cands[1]!.node, true)
  await deliver()
  expect(w1!.cands[1]!.node.remoteInteractive).toBe(0)
  mirror.forget(1)
  expect(primary.cands.map((c) => c.node.remoteInteractive)).toEqual([0, 0])
  // No batch any more: the workers stop reporting, and their views carry no requests.
  wanting = false
  primary.pool.endBatch(primary.cands[0]!.node, true)
  await deliver()
  w0!.pool.begin(w0!.cands[0]!.node)
  await deliver()
  expect(primary.cands[0]!.node.remoteInteractive).toBe(0)
  expect(w0!.cands.map((c) => c.node.remoteInteractive)).toEqual([0, 0])
})
