/**
 * `bun bench/workers.ts [--rounds N] [--seconds S] [--conns C] [--workers W]`: what
 * `server.workers` gains. Two routers of this tree run side by side as processes, one with one
 * process and one with W workers (default 2), billing on, in front of one stub upstream (a process
 * answering every chat request at once with a fixed 16-token completion). wrk (C connections,
 * default 64, keep-alive) loads one, then the other, round after round (one, W, W, one, ...);
 * each round's ratio is W's requests per second over one's, and the figure is the median of the
 * rounds' ratios. Also per request: the CPU of the whole process group (primary and workers, all
 * threads) and of the primary alone (its hub: reservations, settlements, the ledger), from /proc.
 * On a machine whose cores are shared with wrk and the stub upstream, the gain is bounded by
 * what they leave.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { benchChatBody, freePort, routerConfig, startRouter, startStub } from './stub-router.ts'
import { runWrk, wrkPath } from './wrk.ts'

const { values } = parseArgs({
  options: {
    rounds: { type: 'string' },
    seconds: { type: 'string' },
    conns: { type: 'string' },
    workers: { type: 'string' },
    'no-billing': { type: 'boolean' },
    'prompt-bytes': { type: 'string' },
  },
})
const rounds = Number(values.rounds ?? 3)
const seconds = Number(values.seconds ?? 5)
const conns = Number(values.conns ?? 64)
const W = Number(values.workers ?? 2)
if (!wrkPath()) throw new Error('wrk is not installed (apt-get install -y wrk)')
// A longer prompt makes each request the router's own work (its tokens are counted), rather than
// the load generator's or the stub's, which share the machine's cores.
const promptBytes = Number(values['prompt-bytes'] ?? 0)
const BODY = benchChatBody(promptBytes)

const TICK_US = 10_000
/** CPU time (us) of a process, all its threads. */
function cpu(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return (Number(f[11]) + Number(f[12])) * TICK_US
  } catch {
    return 0
  }
}
/** The pids whose parent is `pid`. */
function children(pid: number): number[] {
  const out: number[] = []
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8')
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === pid) out.push(Number(d))
    } catch {
      // gone
    }
  }
  return out
}

const dir = mkdtempSync(join(tmpdir(), 'tropa-workers-bench-'))
const stub = startStub(dir)

async function router(workers: number) {
  const port = freePort()
  const r = await startRouter({
    tree: join(import.meta.dir, '..'),
    config: routerConfig(port, join(dir, `w${workers}`), stub.port, { server: { workers } }),
    configPath: join(dir, `w${workers}.json`),
    env: {
      TROPA_WORKERS: String(workers),
      // The money path off on both sides: what the processes themselves cost, without the hub.
      ...(values['no-billing'] && { TROPA_BENCH_NO_BILLING: '1' }),
    },
    ready: (proc) => children(proc.pid).length >= (workers > 1 ? workers : 0),
  })
  await Bun.sleep(500) // every worker listening
  return { workers, ...r }
}

type Router = Awaited<ReturnType<typeof router>>
async function load(r: Router, s: number) {
  // Bun's own threads aside, the group is the primary and its workers (the stub is not theirs).
  const group = () => [r.proc.pid, ...(r.workers > 1 ? children(r.proc.pid) : [])]
  const pids = group()
  const before = pids.map(cpu)
  const res = await runWrk({
    url: `${r.url}/v1/chat/completions`,
    headers: { authorization: `Bearer ${r.key}` },
    body: BODY,
    connections: conns,
    threads: 2,
    durationS: s,
  })
  const after = pids.map(cpu)
  const total = after.reduce((a, b) => a + b, 0) - before.reduce((a, b) => a + b, 0)
  const primary = after[0]! - before[0]!
  return { ...res, cpuUs: total / res.requests, primaryUs: primary / res.requests }
}

const one = await router(1)
const many = await router(W)
await load(one, 1)
await load(many, 1)
const ratios: number[] = []
const rows: string[] = []
for (let i = 0; i < rounds; i++) {
  const order = i % 2 === 0 ? [one, many] : [many, one]
  const got = new Map<number, Awaited<ReturnType<typeof load>>>()
  for (const r of order) got.set(r.workers, await load(r, seconds))
  const a = got.get(1)!
  const b = got.get(W)!
  if (a.errors + b.errors > 0) console.log(`round ${i + 1}: errors ${a.errors} (1) / ${b.errors} (${W})`)
  ratios.push(b.rps / a.rps)
  const row = `round ${i + 1}: 1 process ${a.rps.toFixed(0)} req/s (p50 ${a.p50.toFixed(2)} ms, p99 ${a.p99.toFixed(2)} ms, ${a.cpuUs.toFixed(0)} us CPU/req); ${W} workers ${b.rps.toFixed(0)} req/s (p50 ${b.p50.toFixed(2)} ms, p99 ${b.p99.toFixed(2)} ms, ${b.cpuUs.toFixed(0)} us CPU/req, primary ${b.primaryUs.toFixed(1)} us); ratio ${(b.rps / a.rps).toFixed(2)}`
  rows.push(row)
  console.log(row)
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!
console.log(
  `${W} workers / 1 process, requests per second: median ${median(ratios).toFixed(2)}x over ${rounds} rounds (${ratios.map((r) => r.toFixed(2)).join(', ')}), ${seconds} s each, wrk -t2 -c${conns}, prompt ${promptBytes || 'short'} bytes, billing ${values['no-billing'] ? 'off' : 'on'}`,
)
for (const r of [one, many]) {
  r.proc.kill('SIGTERM')
  await r.proc.exited
}
stub.proc.kill()
rmSync(dir, { recursive: true, force: true })
process.exit(0)
