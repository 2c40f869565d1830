// Preloaded by bench/heap-census.ts: on SIGUSR2, a full collection and a heap census to /tmp/heap-<pid>-<n>.json.

import { heapStats } from 'bun:jsc'
import { readFileSync, writeFileSync } from 'node:fs'

const rssKiB = () => Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1])
let n = 0
process.on('SIGUSR2', () => {
  const preRssKiB = rssKiB()
  const preHeap = heapStats().heapSize
  Bun.gc(true)
  Bun.gc(true)
  const s = heapStats()
  writeFileSync(
    `/tmp/heap-${process.pid}-${n++}.json`,
    JSON.stringify({ rssKiB: rssKiB(), preRssKiB, preHeap, ...s }),
  )
})
