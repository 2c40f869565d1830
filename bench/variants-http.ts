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
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { freePort, hammer, routerConfig, startRouter, startStub, threadTimes } from './stub-router.ts'

const { values, positionals } = parseArgs({
  options: { rounds: { type: 'string' }, seconds: { type: 'string' }, conns: { type: 'string' } },
  allowPositionals: true,
})
if (positionals.length < 2) {
  console.error("usage: bun bench/variants-http.ts [--rounds N] [--seconds S] [--conns C] '{}' '{...}' [...]")
  process.exit(2)
}
/** A variant: config JSON, or `<tree>#<config JSON>` to run another source tree (a worktree). */
const variants: { tree: string; config: unknown }[] = positionals.map((p) => {
  if (p.startsWith('{')) return { tree: join(import.meta.dir, '..'), config: JSON.parse(p) }
  const at = p.indexOf('#')
  return { tree: resolve(at < 0 ? p : p.slice(0, at)), config: at < 0 ? {} : JSON.parse(p.slice(at + 1)) }
})
const rounds = Number(values.rounds ?? 8)
const seconds = Number(values.seconds ?? 3)
const conns = Number(values.conns ?? 32)
const BODY = JSON.stringify({
  model: 'bench/fast',
  messages: [{ role: 'user', content: 'Say something short about routers and queues.' }],
  max_tokens: 16,
})

const dir = mkdtempSync(join(tmpdir(), 'tropa-variants-bench-'))
const stub = startStub(dir)

async function router(index: number) {
  const port = freePort()
  const v = variants[index]!
  const r = await startRouter({
    tree: v.tree,
    config: routerConfig(port, join(dir, `v${index}`), stub.port, v.config),
    configPath: join(dir, `v${index}.json`),
  })
  return { index, ...r }
}

type Router = Awaited<ReturnType<typeof router>>
const load = (r: Router, ms: number) =>
  hammer(
    `${r.url}/v1/chat/completions`,
    { authorization: `Bearer ${r.key}`, 'content-type': 'application/json' },
    BODY,
    conns,
    ms,
  )

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
    const a = threadTimes(r.proc.pid)
    const n = await load(r, seconds * 1000)
    const b = threadTimes(r.proc.pid)
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
stub.proc.kill()
process.exit(0)
