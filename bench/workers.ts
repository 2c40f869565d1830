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
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
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
const ADMIN = 'bench-admin-token-0123456789abcdef'
const REPLY = JSON.stringify({
  id: 'chatcmpl-sim-1',
  object: 'chat.completion',
  created: 1764000000,
  model: 'chat-small',
  choices: [
    { index: 0, message: { role: 'assistant', content: 'Routers queue requests.' }, finish_reason: 'length' },
  ],
  usage: { prompt_tokens: 16, completion_tokens: 16, total_tokens: 32 },
})
// A longer prompt makes each request the router's own work (its tokens are counted), rather than
// the load generator's or the stub's, which share the machine's cores.
const promptBytes = Number(values['prompt-bytes'] ?? 0)
const words = 'routers queue requests while the nodes answer them in turn and bill each one once '
const BODY = JSON.stringify({
  model: 'bench/fast',
  messages: [
    {
      role: 'user',
      content:
        promptBytes > 0
          ? words.repeat(Math.ceil(promptBytes / words.length)).slice(0, promptBytes)
          : 'Say something short about routers and queues.',
    },
  ],
  max_tokens: 16,
})

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

const free = () => {
  const s = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response() })
  const p = s.port!
  s.stop(true)
  return p
}
const dir = mkdtempSync(join(tmpdir(), 'tropa-workers-bench-'))
const stubPort = free()
const stubFile = join(dir, 'stub.ts')
writeFileSync(
  stubFile,
  `Bun.serve({ port: ${stubPort}, hostname: '127.0.0.1', fetch: (r) => new URL(r.url).pathname.endsWith('/chat/completions') ? new Response(${JSON.stringify(REPLY)}, { headers: { 'content-type': 'application/json' } }) : new Response('{"data":[]}') })`,
)
const stub = Bun.spawn([process.execPath, stubFile], { stdout: 'ignore', stderr: 'inherit' })

async function router(workers: number) {
  const sub = join(dir, `w${workers}`)
  const port = free()
  const cfg = join(dir, `w${workers}.json`)
  writeFileSync(
    cfg,
    JSON.stringify({
      server: { host: '127.0.0.1', port, data_dir: sub, log_level: 'error', admin_token: ADMIN, workers },
      storage: { ledger_queue_max: 5_000_000 },
      models: [
        {
          id: 'bench/fast',
          context_length: 8192,
          pricing_per_million: { prompt: '30', completion: '60' },
          routes: [
            {
              name: 'stub',
              base_url: `http://127.0.0.1:${stubPort}/v1`,
              upstream_model: 'chat-small',
              max_concurrency: 100_000,
            },
          ],
        },
      ],
    }),
  )
  const proc = Bun.spawn(
    [
      process.execPath,
      '--max-http-header-size=65536',
      join(import.meta.dir, '../src/main.ts'),
      '--config',
      cfg,
    ],
    {
      stdout: 'ignore',
      stderr: 'inherit',
      env: {
        PATH: process.env.PATH ?? '',
        TROPA_WORKERS: String(workers),
        // The money path off on both sides: what the processes themselves cost, without the hub.
        ...(values['no-billing'] && { TROPA_BENCH_NO_BILLING: '1' }),
      },
    },
  )
  const url = `http://127.0.0.1:${port}`
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${url}/ready`)).ok && children(proc.pid).length >= (workers > 1 ? workers : 0)) break
    } catch {}
    if (i > 2000) throw new Error('router did not start')
    await Bun.sleep(10)
  }
  await Bun.sleep(500) // every worker listening
  const post = (path: string, token: string, b: unknown) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify(b),
    }).then((r) => r.json() as Promise<Record<string, string>>)
  const org = await post('/v1/admin/organizations', ADMIN, { name: 'b', balance_rub: 10_000_000 })
  const key = (await post('/v1/keys', org.master_key!, { name: 'k' })).key!
  return { workers, proc, url, key }
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
stub.kill()
rmSync(dir, { recursive: true, force: true })
process.exit(0)
