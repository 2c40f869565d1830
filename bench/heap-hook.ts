// Preloaded by bench/heap-census.ts: on SIGUSR2, a full collection and a heap census to /tmp/heap-<pid>-<n>.json
// (with the JS heap's capacity and mimalloc's own figures before it); on SIGUSR1, a heap snapshot in V8's
// format (closures' scopes named by their variables) to /tmp/heap-<pid>.heapsnapshot.

import { heapStats, memoryUsage } from 'bun:jsc'
import { readFileSync, writeFileSync } from 'node:fs'

const rssKiB = () => Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1])
let n = 0
process.on('SIGUSR2', () => {
  const preRssKiB = rssKiB()
  const preHeap = heapStats().heapSize
  const preMem = memoryUsage()
  const preCap = heapStats().heapCapacity
  Bun.gc(true)
  Bun.gc(true)
  const s = heapStats()
  writeFileSync(
    `/tmp/heap-${process.pid}-${n++}.json`,
    JSON.stringify({ rssKiB: rssKiB(), preRssKiB, preHeap, preMem, preCap, mem: memoryUsage(), ...s }),
  )
})
process.on('SIGUSR1', () => {
  Bun.gc(true)
  writeFileSync(
    `/tmp/heap-${process.pid}.heapsnapshot`,
    JSON.stringify(Bun.generateHeapSnapshot('v8' as never)),
  )
})
