/**
 * `bun bench/variants-http.ts [--rounds N] [--seconds S] [--conns C] <variant> <variant> [...]`:
 * what a setting costs a router over real HTTP. Each variant is a JSON object merged into the
 * bench's config (`'{}'`: the defaults; `'{"metrics":{"requests":false}}'`; the same variant twice
 * shows the measure's own noise, an A/A run), or `<tree>#<JSON>` (`/work/other#{}`): another
 * source tree, a worktree of another commit with its own `bun install`. One router of this tree per variant runs as a
 * process, all side by side, in front of one stub upstream (a process answering every chat
 * request at once with a fixed 16-token completion); a load of C connections (default 32) goes to
 * one router after the other, the order rotating every round. Per request: each router's
 * event-loop CPU (its main thread, from /proc), its other threads' (the ledger's, receipts',
 * Bun's pools), and the requests answered per second; the first variant over each other one
 * from each round's pair (mean ± se, and the median). Complements bench/request-path.ts, whose
 * in-process requests never leave the microtask queue: there any await of another thread (or a
 * mere setImmediate) costs a loop turn per request that a served request, which waits for
 * sockets anyway, does not pay.
 */
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'

const { values, positionals } = parseArgs({
  options: { rounds: { type: 'string' }, seconds: { type: 'string' }, conns: { type: 'string' } },
  allowPositionals: true,
})
if (positionals.length < 2) {
  console.error("usage: bun bench/variants-http.ts [--rounds N] [--seconds S] [--conns C] '{}' '{...}' [...]")
  process.exit(2)
}
// biome-ignore lint/suspicious/noExplicitAny: a config fragment of any shape
type Any = any
/** A variant: config JSON, or `<tree>#<config JSON>` to run another source tree (a worktree). */
const variants: { tree: string; config: Any }[] = positionals.map((p) => {
  if (p.startsWith('{')) return { tree: join(import.meta.dir, '..'), config: JSON.parse(p) }
  const at = p.indexOf('#')
  return { tree: resolve(at < 0 ? p : p.slice(0, at)), config: at < 0 ? {} : JSON.parse(p.slice(at + 1)) }
})
const rounds = Number(values.rounds ?? 8)
const seconds = Number(values.seconds ?? 3)
const conns = Number(values.conns ?? 32)
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
const BODY = JSON.stringify({
  model: 'bench/fast',
  messages: [{ role: 'user', content: 'Say something short about routers and queues.' }],
  max_tokens: 16,
})

const TICK_US = 10_000
/** CPU time (us) per thread name of a process. */
function threads(pid: number): Map<string, number> {
  const out = new Map<string, number>()
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${t}/stat`, 'utf8')
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      const name = Number(t) === pid ? 'loop' : readFileSync(`/proc/${pid}/task/${t}/comm`, 'utf8').trim()
      out.set(name, (out.get(name) ?? 0) + (Number(f[11]) + Number(f[12])) * TICK_US)
    } catch {
      // a thread that ended
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
const dir = mkdtempSync(join(tmpdir(), 'tropa-variants-bench-'))
const stubPort = free()
const stubFile = join(dir, 'stub.ts')
writeFileSync(
  stubFile,
  `Bun.serve({ port: ${stubPort}, hostname: '127.0.0.1', fetch: (r) => new URL(r.url).pathname.endsWith('/chat/completions') ? new Response(${JSON.stringify(REPLY)}, { headers: { 'content-type': 'application/json' } }) : new Response('{"data":[]}') })`,
)
const stub = Bun.spawn([process.execPath, stubFile], { stdout: 'ignore', stderr: 'inherit' })

/** `base` with `extra` merged in, objects key by key (arrays and values replaced). */
function merged(base: Any, extra: Any): Any {
  if (typeof extra !== 'object' || extra === null || Array.isArray(extra)) return extra
  const out = { ...base }
  for (const [k, v] of Object.entries(extra)) out[k] = merged(base?.[k], v)
  return out
}

async function router(index: number) {
  const sub = join(dir, `v${index}`)
  const port = free()
  const cfg = join(dir, `v${index}.json`)
  const base = {
    server: { host: '127.0.0.1', port, data_dir: sub, log_level: 'error', admin_token: ADMIN, workers: 1 },
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
  }
  writeFileSync(cfg, JSON.stringify(merged(base, variants[index]!.config)))
  const proc = Bun.spawn(
    [
      process.execPath,
      '--max-http-header-size=65536',
      join(variants[index]!.tree, 'src/main.ts'),
      '--config',
      cfg,
    ],
    { stdout: 'ignore', stderr: 'inherit', env: { PATH: process.env.PATH ?? '' } },
  )
  const url = `http://127.0.0.1:${port}`
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${url}/ready`)).ok) break
    } catch {}
    if (i > 1000) throw new Error('router did not start')
    await Bun.sleep(10)
  }
  const post = (path: string, token: string, b: unknown) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify(b),
    }).then((r) => r.json() as Promise<Record<string, string>>)
  const org = await post('/v1/admin/organizations', ADMIN, { name: 'b', balance_rub: 10_000_000 })
  const key = (await post('/v1/keys', org.master_key!, { name: 'k' })).key!
  return { index, proc, url, key }
}

type Router = Awaited<ReturnType<typeof router>>
async function load(r: Router, ms: number): Promise<number> {
  const until = performance.now() + ms
  let n = 0
  const headers = { authorization: `Bearer ${r.key}`, 'content-type': 'application/json' }
  await Promise.all(
    Array.from({ length: conns }, async () => {
      while (performance.now() < until) {
        const res = await fetch(`${r.url}/v1/chat/completions`, { method: 'POST', headers, body: BODY })
        if (res.status !== 200) throw new Error(`${res.status} ${await res.text()}`)
        await res.arrayBuffer()
        n++
      }
    }),
  )
  return n
}

const routers: Router[] = []
for (let i = 0; i < variants.length; i++) routers.push(await router(i))
for (const r of routers) await load(r, 1000)
const per = routers.map(() => ({ loop: [] as number[], other: [] as number[], rps: [] as number[] }))
/** ratios[v][round]: variant 0's event-loop CPU per request over variant v's, minus 1. */
const ratios = routers.map(() => [] as number[])
for (let i = 0; i < rounds; i++) {
  const order = routers.map((_, k) => routers[(k + i) % routers.length]!)
  const got: number[] = []
  for (const r of order) {
    const a = threads(r.proc.pid)
    const n = await load(r, seconds * 1000)
    const b = threads(r.proc.pid)
    const loop = (b.get('loop')! - a.get('loop')!) / n
    let other = 0
    for (const [name, us] of b) if (name !== 'loop') other += us - (a.get(name) ?? 0)
    per[r.index]!.loop.push(loop)
    per[r.index]!.other.push(other / n)
    per[r.index]!.rps.push(n / seconds)
    got[r.index] = loop
  }
  for (let v = 1; v < routers.length; v++) ratios[v]!.push(got[0]! / got[v]! - 1)
  console.log(`round ${i + 1}: event loop ${got.map((x) => x.toFixed(1)).join(' / ')} us per request`)
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!
const pct = (x: number) => `${x >= 0 ? '+' : ''}${(x * 100).toFixed(1)}%`
console.log(`medians of ${rounds} rounds of ${seconds} s, ${conns} connections:`)
routers.forEach((_r, v) => {
  const p = per[v]!
  console.log(
    `  ${positionals[v]}: event loop ${median(p.loop).toFixed(1)} us, other threads ${median(p.other).toFixed(1)} us per request, ${median(p.rps).toFixed(0)} requests/s`,
  )
  if (v === 0) return
  const rs = ratios[v]!
  const mean = rs.reduce((a, b) => a + b, 0) / rs.length
  const se = Math.sqrt(rs.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, rs.length - 1) / rs.length)
  console.log(
    `    first / this - 1 (event loop): ${pct(mean)} ± ${(se * 100).toFixed(1)}% (mean ± se), median ${pct(median(rs))}`,
  )
})
for (const r of routers) r.proc.kill()
stub.kill()
process.exit(0)
