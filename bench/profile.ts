/**
 * `bun bench/profile.ts [--seconds S] [--conns C] [--stream] [--interval US] [--tree T] [--config JSON]`:
 * where a pass-through request's microseconds go (issue #24). One router of the tree (default
 * this one) runs as a process under Bun's sampling profiler (`--cpu-prof`), in front of the stub
 * upstream of stub-router.ts (a 16-token completion, or with `--stream` 16 one-token SSE chunks
 * and a usage chunk); C connections (default 32) send chat requests for S seconds (default 10)
 * after 2 s of warm-up. The samples taken during the measured seconds are attributed to the
 * lifecycle's stages by the source file of the nearest JavaScript frame (a native function
 * such as JSON.parse counts for its caller), and each stage's share of the samples is turned
 * into microseconds of the event loop's CPU per request (from /proc over the same seconds).
 * What the loop spends outside any sampled JavaScript frame (Bun's own HTTP server and client,
 * sockets, the event loop itself) is the remainder. Prints the stages, then the functions with
 * the most samples; `--json F` writes both. The router also runs with JavaScriptCore's GC log
 * (`BUN_JSC_logGC`): the collections during the measured seconds and the loop's pauses in them.
 * The sampler takes the loop's stack at wall-clock intervals while JavaScript runs, so on a busy
 * machine a function during which the thread was descheduled (fetch, which wakes Bun's HTTP
 * thread) reads longer than its CPU time.
 *
 * `--analyze F --requests N [--skip-ms MS]`: the same attribution for a profile written by
 * anything else (`bun --cpu-prof bench/request-path.ts .`: the app in-process, no HTTP), its
 * first MS milliseconds left out, per N requests. `--bare plain|relay|json` profiles
 * bench/bare-proxy.ts (bytes passed through, the body read in JavaScript, or the request and the
 * answer parsed and written again) the same way instead of the router.
 */
import { mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { baseEnv, spawnChild, waitForFile } from './proc.ts'
import { freePort, hammer, merged, routerConfig, startRouter, startStub, threadTimes } from './stub-router.ts'

const { values } = parseArgs({
  options: {
    seconds: { type: 'string' },
    conns: { type: 'string' },
    stream: { type: 'boolean' },
    interval: { type: 'string' },
    tree: { type: 'string' },
    config: { type: 'string' },
    json: { type: 'string' },
    top: { type: 'string' },
    bare: { type: 'string' },
    analyze: { type: 'string' },
    warmup: { type: 'string' },
    requests: { type: 'string' },
    'skip-ms': { type: 'string' },
  },
})
const seconds = Number(values.seconds ?? 10)
const conns = Number(values.conns ?? 32)
const stream = values.stream === true
const intervalUs = Number(values.interval ?? 250)
const tree = resolve(values.tree ?? join(import.meta.dir, '..'))
const top = Number(values.top ?? 25)

/** A lifecycle stage by the source file of a frame (the first pattern that matches). */
const STAGES: [string, RegExp][] = [
  [
    'Elysia and TypeBox (routing, context, hooks, the response)',
    /node_modules\/(elysia|@sinclair|@elysiajs)\//,
  ],
  ['auth (the key, its organization)', /src\/(http\/auth|identity)\b/],
  ['validate (body read, size and depth, schema)', /src\/(http\/body|json-depth|api)\b/],
  ['count tokens', /src\/(pipeline\/tokens|tokenizer)|node_modules\/gpt-tokenizer/],
  ['admit and reserve, settle (money, limits)', /src\/billing\//],
  ['route (policy, nodes)', /src\/routing\//],
  ['upstream adapter (the call, its headers)', /src\/upstream\//],
  ['relay and the lifecycle (pipeline/)', /src\/(pipeline|responses)\//],
  ['record (metrics, access log, tracing)', /src\/(metrics|log|tracing)\b/],
  ['storage (ledger queue, store)', /src\/storage\/|node_modules\/drizzle-orm/],
  ['routes and error mapping (http/, app.ts, errors.ts)', /src\/(http|app|errors)\b/],
  ['the rest of src/', /\/src\//],
  ['other packages', /node_modules\//],
]
const NATIVE = 'no JavaScript caller (native callbacks, promise jobs)'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
  children?: number[]
}
interface Profile {
  nodes: ProfileNode[]
  startTime: number
  endTime: number
  samples: number[]
  timeDeltas: number[]
}

function stageOf(url: string): string | undefined {
  if (!url) return undefined
  for (const [name, re] of STAGES) if (re.test(url)) return name
  return 'Bun built-ins in JavaScript'
}

/** Samples per stage and per function within [from, to] (µs, the profile's clock). */
export function attribute(p: Profile, from: number, to: number) {
  const byId = new Map(p.nodes.map((n) => [n.id, n]))
  const parent = new Map<number, number>()
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
  const stageMemo = new Map<number, string>()
  const stage = (id: number): string => {
    const known = stageMemo.get(id)
    if (known) return known
    let s: string | undefined
    for (let at: number | undefined = id; at !== undefined && !s; at = parent.get(at))
      s = stageOf(byId.get(at)!.callFrame.url)
    stageMemo.set(id, s ?? NATIVE)
    return s ?? NATIVE
  }
  const stages = new Map<string, number>()
  const fns = new Map<string, number>()
  let t = p.startTime
  let n = 0
  for (let i = 0; i < p.samples.length; i++) {
    t += p.timeDeltas[i]!
    if (t < from || t > to) continue
    const id = p.samples[i]!
    const node = byId.get(id)!
    if (node.callFrame.functionName === '(root)' || node.callFrame.functionName === '(idle)') continue
    n++
    const s = stage(id)
    stages.set(s, (stages.get(s) ?? 0) + 1)
    let caller = ''
    if (!node.callFrame.url) {
      const up = parent.get(id)
      const f = up === undefined ? undefined : byId.get(up)!.callFrame
      caller = f ? ` (in ${f.functionName || '(anonymous)'} ${short(f.url)})` : ''
    }
    const fn = `${node.callFrame.functionName || '(anonymous)'} ${short(node.callFrame.url)}${caller}`
    fns.set(fn, (fns.get(fn) ?? 0) + 1)
  }
  return { samples: n, stages, fns }
}

function short(url: string): string {
  if (!url) return '[native]'
  const m = /(node_modules\/.*|src\/.*)$/.exec(url)
  return m ? m[1]! : url.replace(/^file:\/\//, '')
}

function analyze(file: string, requests: number, skipMs: number) {
  const p = JSON.parse(readFileSync(file, 'utf8')) as Profile
  const got = attribute(p, p.startTime + skipMs * 1000, Number.POSITIVE_INFINITY)
  const perSample = (p.endTime - p.startTime) / p.samples.length
  const us = (k: number) => (k * perSample) / requests
  console.log(`${got.samples} samples, ${us(got.samples).toFixed(2)} us per request`)
  console.log('\nstage | us per request | share of the samples')
  for (const [name, k] of [...got.stages].sort((x, y) => y[1] - x[1]))
    console.log(`${name} | ${us(k).toFixed(2)} | ${((100 * k) / got.samples).toFixed(1)}%`)
  console.log(`\nfunction (self samples) | us per request`)
  for (const [name, k] of [...got.fns].sort((x, y) => y[1] - x[1]).slice(0, top))
    console.log(`${name} | ${us(k).toFixed(2)}`)
}

async function main() {
  if (values.analyze) return analyze(values.analyze, Number(values.requests), Number(values['skip-ms'] ?? 0))
  const dir = mkdtempSync(join(tmpdir(), 'tropa-profile-'))
  const stub = startStub(dir)
  const port = freePort()
  const profDir = join(dir, 'prof')
  const extra = values.config ? JSON.parse(values.config) : {}
  const flags = ['--cpu-prof', `--cpu-prof-dir=${profDir}`, `--cpu-prof-interval=${intervalUs}`]
  const r = values.bare
    ? await startBare(dir, flags, stub.port, values.bare)
    : await startRouter({
        tree,
        config: routerConfig(port, join(dir, 'data'), stub.port, merged({}, extra)),
        configPath: join(dir, 'tropa.json'),
        bunFlags: flags,
        // The runtime setting as the router gives itself (src/cli/tuned-runtime.ts), which does not
        // start itself again under a profiler (a sampling signal would outlive the exec).
        env: { BUN_JSC_logGC: 'true', BUN_JSC_useWarmUpMarkedBlocks: '0' },
        stderrFile: join(dir, 'gc.log'),
      }).then((x) => ({ ...x, path: '/v1/chat/completions', gcLog: join(dir, 'gc.log') }))
  const body = JSON.stringify({
    model: 'bench/fast',
    messages: [{ role: 'user', content: 'Say something short about routers and queues.' }],
    max_tokens: 16,
    ...(stream && { stream: true }),
  })
  const headers = { authorization: `Bearer ${r.key}`, 'content-type': 'application/json' }
  const load = (ms: number) =>
    hammer(
      `${r.url}${r.path}`,
      headers,
      body,
      conns,
      ms,
      (status, text) => status === 200 && (!stream || text.includes('[DONE]')),
    )
  await load(Number(values.warmup ?? 2) * 1000)
  const a = threadTimes(r.proc.pid)
  const logFrom = statSync(r.gcLog).size
  const from = Date.now() * 1000
  const n = await load(seconds * 1000)
  const to = Date.now() * 1000
  const b = threadTimes(r.proc.pid)
  const logTo = statSync(r.gcLog).size
  const loopUs = (b.get('loop')! - a.get('loop')!) / n
  r.proc.kill('SIGTERM')
  await r.proc.exited
  stub.proc.kill()
  const gc = gcTally(readFileSync(r.gcLog).subarray(logFrom, logTo).toString('utf8'))
  const file = readdirSync(profDir).find((f) => f.endsWith('.cpuprofile'))
  if (!file) throw new Error('the router wrote no profile')
  const p = JSON.parse(readFileSync(join(profDir, file), 'utf8')) as Profile
  const got = attribute(p, from, to)
  const sampledUs = (got.samples * intervalUs) / n
  const rows = [...got.stages].sort((x, y) => y[1] - x[1])
  const us = (k: number) => (k * intervalUs) / n
  console.log(
    `${n} ${stream ? 'streamed' : 'JSON'} requests in ${seconds} s (${(n / seconds).toFixed(0)}/s), ${conns} connections; event loop ${loopUs.toFixed(1)} us of CPU per request, ${sampledUs.toFixed(1)} us of it sampled in JavaScript (${got.samples} samples every ${intervalUs} us)`,
  )
  const cycles = gc.cycles
  const gcUs = (gc.pauseMs * 1000) / n
  console.log(
    `garbage collection: ${cycles} collections (${gc.full} full), ${((1000 * cycles) / n).toFixed(2)} per 1,000 requests, pauses ${gcUs.toFixed(2)} us per request (${((100 * gcUs) / loopUs).toFixed(1)}% of the loop; counted in the stages below, wherever the allocation that set each off was)`,
  )
  console.log('\nstage | us per request | share of the loop')
  for (const [name, k] of rows)
    console.log(`${name} | ${us(k).toFixed(2)} | ${((100 * us(k)) / loopUs).toFixed(1)}%`)
  const rest = loopUs - sampledUs
  console.log(
    `outside sampled JavaScript (Bun's HTTP server and client, sockets, the loop) | ${rest.toFixed(2)} | ${((100 * rest) / loopUs).toFixed(1)}%`,
  )
  console.log(`\nfunction (self samples) | us per request`)
  const fnRows = [...got.fns].sort((x, y) => y[1] - x[1]).slice(0, top)
  for (const [name, k] of fnRows) console.log(`${name} | ${us(k).toFixed(2)}`)
  if (values.json)
    writeFileSync(
      values.json,
      JSON.stringify(
        {
          requests: n,
          seconds,
          conns,
          stream,
          loopUsPerRequest: loopUs,
          sampledUsPerRequest: sampledUs,
          gc: { collections: cycles, full: gc.full, pauseUsPerRequest: gcUs },
          stages: Object.fromEntries(rows.map(([k, v]) => [k, us(v)])),
          functions: Object.fromEntries(fnRows.map(([k, v]) => [k, us(v)])),
        },
        null,
        2,
      ),
    )
  process.exit(0)
}

/**
 * Collections (full ones apart) and their pauses, from JavaScriptCore's GC log (`BUN_JSC_logGC`).
 * A collection marked concurrently stops the loop several times, one log line each (the later
 * ones start `M a=` or `C a=`), each with its own `p=`: all of them are summed. A line cut at the
 * window's edge before its `p=` is left out. (Before 2026-11-27 only a collection's first stop
 * was summed, which left out most of the long ones: about a third of the total.)
 */
export function gcTally(log: string): { cycles: number; full: number; pauseMs: number } {
  const t = { cycles: 0, full: 0, pauseMs: 0 }
  for (const line of log.split('\n')) {
    if (!line.startsWith('[GC<') || !line.includes(' p=')) continue
    const start = /: START .* => (\w+)Collection,/.exec(line)
    if (start) {
      t.cycles++
      if (start[1] === 'Full') t.full++
      // The later stops run by the mutator (M) or the collector thread (C).
    } else if (!/^\[GC<[^>]*>: [MC] a=/.test(line)) continue
    for (const m of line.matchAll(/ p=([\d.]+)ms/g)) t.pauseMs += Number(m[1])
  }
  return t
}

/** bench/bare-proxy.ts under the profiler, in front of the stub. */
async function startBare(dir: string, flags: string[], stubPort: number, mode: string) {
  const out = join(dir, 'bare.port')
  const child = spawnChild({
    name: 'bare',
    cmd: [
      process.execPath,
      ...flags,
      join(import.meta.dir, 'bare-proxy.ts'),
      JSON.stringify({ stub: [`http://127.0.0.1:${stubPort}/v1`] }),
      out,
      ...(mode === 'relay' || mode === 'json' ? [mode] : []),
    ],
    env: baseEnv({ BUN_JSC_logGC: 'true' }),
    logDir: dir,
    raw: true,
  })
  const port = await waitForFile(out, child, 10_000)
  // spawnChild writes stderr to `<log>.err`: the GC log is read from there.
  return {
    proc: child.proc,
    url: `http://127.0.0.1:${port}`,
    key: 'none',
    path: '/stub/v1/chat/completions',
    gcLog: `${child.log}.err`,
  }
}

if (import.meta.main) await main()
