/**
 * `bun run bench:routing-http`: the virtual-time routing comparison, smaller, over real HTTP.
 * Tropa (this process, its real request path) routes streamed chat completions to four real
 * simulator nodes in a process of their own, once per routing policy, each time with a freshly
 * started fleet and the same request sequence. The client measures time to first token from
 * each request's intended start (open loop). Workload: W1-like shared prefixes (8 groups x
 * ~1.5k-token prefix + ~150-token unique suffix, 32 tokens out), at 70% of the fleet's nominal
 * capacity without cache reuse.
 *
 * Fleets (`--fleet`): `mixed` (default; 1 fast, 2 medium, 1 slow llama.cpp-like),
 * `identical` (4 medium) and `mixed-6` (2 of each kind: every node has a twin with the same
 * KV-cache size in its /metrics). `--stall`: node 0 stops answering (no tokens, no errors, frozen
 * /metrics: the simulator's `stall` fault) from 40% of the run for `--stall-seconds` (default
 * 10), then carries on; the table counts the requests the policy sent it more than 2 s into the
 * stall (first attempts and hedges). `--slow F` instead: node 0 runs F times slower over that
 * window (the simulator's `slowdownFactor`: every step, prefill and decode), answering all along.
 * `--fault-at S`: the fault starts S seconds into the run instead (0: before its first request).
 *
 * The peers are bench/vt/policies.ts's, with bench/vt/README.md's citations for every default.
 * In the real request path they see what the router sees: Tropa's 256-character prefix blocks
 * stand in for the 64- and 128-character blocks llm-d and production-stack hash (llm-d's cap
 * of 256 blocks of 64 characters becomes 64 blocks, its per-pod LRU a quarter of the pod's
 * `num_gpu_blocks`), and llm-d's endpoint picker scrapes each node's /metrics itself every
 * 50 ms (its DefaultRefreshMetricsInterval): waiting requests, KV-cache use and
 * `vllm:cache_config_info`. Tropa runs as shipped (/metrics every 1 s, hedging within 5%).
 *
 * `--seconds N` (default 40), `--load L` (default 0.7), `--policies a,b` (default all),
 * `--seed S` (default 1: the request sequence and the policies' random draws).
 * Internal: `--serve-fleet <out file>` runs the fleet.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { createApp } from '../src/app.ts'
import { loadConfig } from '../src/config/load.ts'
import type { NodeState } from '../src/routing/nodes.ts'
import { LeastInFlight, type RoutingPolicy } from '../src/routing/policy.ts'
import { PredictedTtft } from '../src/routing/predicted.ts'
import { parseNodeMetrics } from '../src/routing/probes.ts'
import { buildServices } from '../src/services.ts'
import { type SimNodeOptions, startSimFleet } from '../src/simulator/index.ts'
import { openStore } from '../src/storage/open.ts'
import { encode, loadTokenizer } from '../src/tokenizer.ts'
import { openLoop } from './load.ts'
import { baseEnv, killAll, spawnChild, waitForFile } from './proc.ts'
import {
  LlmdEndpointPicker,
  PeakEwma,
  RoundRobin,
  SglangCacheAware,
  VllmPrefixAware,
  VllmSession,
} from './vt/policies.ts'
import { fleetCapacity, type NodeSpec } from './vt/sim.ts'
import { seeded } from './vt/workloads.ts'

const ROOT = resolve(import.meta.dir, '..')
const ADMIN = 'bench-routing-http-admin-token-0123'
const OUT_TOKENS = 32
const GROUPS = 8

type FleetSpec = readonly (NodeSpec & { cacheBlocks: number })[]
const medium = (i: number) => node(`medium-${i}`, 'medium', 8_000, 25, 32, 4096, 1, 12_000)
/** The fleets: the virtual-time fleets' node kinds; node 0 is the one that stalls. */
const FLEETS: Record<string, FleetSpec> = {
  mixed: [
    node('fast-1', 'fast', 20_000, 15, 64, 8192, 1, 40_000),
    medium(1),
    medium(2),
    node('slow-1', 'slow', 2_500, 40, 4, 512, 1, 1_000),
  ],
  identical: [medium(1), medium(2), medium(3), medium(4)],
  /** Every kind twice: a node of each kind has a twin reporting the same KV-cache size. */
  'mixed-6': [
    node('fast-1', 'fast', 20_000, 15, 64, 8192, 1, 40_000),
    node('fast-2', 'fast', 20_000, 15, 64, 8192, 2, 40_000),
    medium(1),
    medium(2),
    node('slow-1', 'slow', 2_500, 40, 4, 512, 1, 1_000),
    node('slow-2', 'slow', 2_500, 40, 4, 512, 2, 1_000),
  ],
}

function node(
  name: string,
  kind: NodeSpec['kind'],
  prefillTokensPerSec: number,
  itlMs: number,
  maxSeqs: number,
  prefillBudgetTokens: number,
  rttMs: number,
  cacheBlocks: number,
) {
  return {
    name,
    kind,
    prefillTokensPerSec,
    itlMs,
    maxSeqs,
    cacheTokens: cacheBlocks * 16,
    prefillBudgetTokens,
    rttMs,
    cacheBlocks,
  }
}

/**
 * llm-d's endpoint picker (bench/vt/policies.ts) with its own metrics refresh: every 50 ms
 * (pkg/epp/server/runserver.go, DefaultRefreshMetricsInterval) it reads each node's /metrics
 * page as the EPP's vLLM metrics mapping does: waiting requests, KV-cache use, and the cache
 * size from `vllm:cache_config_info` (autoTune), in 256-character blocks here (4 characters a
 * token), since the router's prefix blocks stand in for its 64-character ones.
 */
class HttpLlmd extends LlmdEndpointPicker {
  private readonly targets = new Map<NodeState, { url: string; busy: boolean }>()
  private timer: ReturnType<typeof setInterval> | undefined
  constructor(
    rng: () => number,
    private readonly refreshMs = 50,
  ) {
    super(rng, undefined, 64)
  }
  override choose(...args: Parameters<LlmdEndpointPicker['choose']>) {
    for (const c of args[0])
      if (!this.targets.has(c.node) && c.route.metricsUrl)
        this.targets.set(c.node, { url: c.route.metricsUrl, busy: false })
    this.timer ??= setInterval(() => this.scrape(), this.refreshMs)
    return super.choose(...args)
  }
  private scrape() {
    for (const [node, t] of this.targets) {
      if (t.busy) continue
      t.busy = true
      fetch(t.url, { signal: AbortSignal.timeout(1000) })
        .then((r) => r.text())
        .then((text) => {
          const m = parseNodeMetrics(text)
          if (!m || this.timer === undefined) return
          const gpuBlocks = m.cacheBlocks ?? 7_812
          const blockTokens = Number(/block_size="(\d+)"/.exec(text)?.[1] ?? 16)
          this.nodeMetrics(node, {
            ...m,
            cacheBlocks: Math.max(1, Math.round((gpuBlocks * blockTokens) / 64)),
          })
        })
        .catch(() => {})
        .finally(() => {
          t.busy = false
        })
    }
  }
  stop() {
    clearInterval(this.timer)
    this.timer = undefined
  }
}

const POLICIES: Record<string, (rng: () => number) => RoutingPolicy> = {
  'round-robin': () => new RoundRobin(),
  'least-busy': () => new LeastInFlight(),
  'peak-ewma': (rng) => new PeakEwma(rng),
  'sglang-cache-aware': () => new SglangCacheAware(),
  'llm-d-epp': (rng) => new HttpLlmd(rng),
  'vllm-prefixaware': (rng) => new VllmPrefixAware(rng),
  'vllm-session': () => new VllmSession(),
  tropa: (rng) => new PredictedTtft({ rng }),
}

/** Loads this process's tokenizer tables and runs the encoder once, before anything is timed. */
async function warmTokenizer(): Promise<void> {
  await loadTokenizer()
  encode(text(seeded(1), 2000))
}

/**
 * Runs the fleet, with a control port to stall and resume a node (POST /stall/<i>?on=1|0), or
 * to slow it down and back (`&factor=F`).
 */
async function runFleet(out: string, spec: FleetSpec) {
  const fleet = await startSimFleet(
    spec.map(
      (n, i): SimNodeOptions => ({
        name: n.name,
        seed: i + 1,
        prefillTokensPerSec: n.prefillTokensPerSec,
        itlMs: n.itlMs,
        maxSeqs: n.maxSeqs,
        prefillBudgetTokens: n.prefillBudgetTokens,
        cacheBlocks: n.cacheBlocks,
        iterationOverheadMs: 1,
      }),
    ),
  )
  // A real node is warm when a router starts routing to it: the simulator's tokenizer tables
  // load on its first request (about a second with the event loop stopped), which every node
  // of this process would otherwise pay within the policy's first samples.
  await warmTokenizer()
  const control = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    fetch(req) {
      const u = new URL(req.url)
      const m = /^\/stall\/(\d+)$/.exec(u.pathname)
      const n = m ? fleet.nodes[Number(m[1])] : undefined
      if (req.method !== 'POST' || !n) return new Response('no such node', { status: 404 })
      const on = u.searchParams.get('on') === '1'
      const factor = u.searchParams.get('factor')
      n.setFaults(factor === null ? { stall: on } : { slowdownFactor: on ? Number(factor) : 1 })
      return new Response('ok')
    },
  })
  writeFileSync(
    out,
    JSON.stringify({
      control: `http://127.0.0.1:${control.port}`,
      nodes: fleet.nodes.map((n) => ({ name: n.name, url: n.url })),
    }),
  )
  const stop = async () => {
    await control.stop(true)
    await fleet.stop()
    process.exit(0)
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

/** Words for prompts: common English words tokenize to about one token each. */
const WORDS =
  'the of and to in is was for on that with as by at from his her are this be which or had not but have they one were all their an has been more when there who will would so can no if out up into some about than them these its only other time new could may first any like over such then'.split(
    ' ',
  )

function text(rng: () => number, words: number): string {
  const out: string[] = []
  for (let i = 0; i < words; i++) out.push(WORDS[Math.floor(rng() * WORDS.length)]!)
  return out.join(' ')
}

/** The request sequence: group i % 8's shared prefix, then a unique suffix; same for every policy. */
function requests(n: number, seed: number): string[] {
  const rng = seeded(seed)
  const prefixes = Array.from({ length: GROUPS }, (_, g) => `Document ${g}: ${text(rng, 1500)}`)
  return Array.from({ length: n }, (_, i) =>
    JSON.stringify({
      model: 'bench/chat',
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: OUT_TOKENS,
      messages: [
        { role: 'system', content: prefixes[Math.floor(rng() * GROUPS)] },
        { role: 'user', content: `Question ${i}: ${text(rng, 150)}` },
      ],
    }),
  )
}

interface Row {
  policy: string
  sent: number
  measured: number
  errors: number
  meanMs: number
  p50Ms: number
  p90Ms: number
  p99Ms: number
  goodput: number
  cachedShare: number
  /** With --stall or --slow: requests sent to node 0 more than 2 s into its fault (hedges too). */
  sentToStalled: number | null
}

interface Scenario {
  fleet: string
  rate: number
  seconds: number
  seed: number
  /** Node 0 stalls (or, with `factor`, runs that many times slower) from `atS` for `forS` seconds into the run. */
  stall: { atS: number; forS: number; factor?: number } | undefined
}

async function runPolicy(name: string, bodies: string[], sc: Scenario): Promise<Row> {
  const { rate, seconds } = sc
  const dir = mkdtempSync(join(tmpdir(), 'tropa-routing-http-'))
  const fleetFile = join(dir, 'fleet.json')
  const fleetProc = spawnChild({
    name: `fleet-${name}`,
    cmd: ['bun', join(ROOT, 'bench/routing-http.ts'), '--serve-fleet', fleetFile, '--fleet', sc.fleet],
    cwd: ROOT,
    env: baseEnv(),
    logDir: dir,
  })
  const { control, nodes: fleet } = JSON.parse(await waitForFile(fleetFile, fleetProc, 20_000)) as {
    control: string
    nodes: { name: string; url: string }[]
  }
  const configPath = join(dir, 'tropa.json')
  writeFileSync(
    configPath,
    JSON.stringify({
      server: { port: 0, data_dir: dir, admin_token: ADMIN, log_level: 'error', billing: false },
      // Tropa as shipped (/metrics every 1 s, hedging within 5%); the peers without polls of
      // Tropa's (llm-d's picker scrapes /metrics itself), and none of them hedges.
      routing: { health_check_ms: 0, ...(name !== 'tropa' && { metrics_poll_ms: 0 }) },
      models: [
        {
          id: 'bench/chat',
          owned_by: 'bench',
          kind: 'chat',
          context_length: 8192,
          pricing: { prompt: '0', completion: '0' },
          routes: fleet.map((n) => ({
            name: n.name,
            base_url: n.url,
            upstream_model: 'chat-up',
            max_concurrency: 1024,
          })),
        },
      ],
    }),
  )
  const config = loadConfig({ configPath }, {})
  const store = await openStore(config.storage)
  const policy = POLICIES[name]!(seeded(6 + sc.seed))
  // The stall's window in this process's clock, and the requests placed on the stalled node in it.
  const stalled = { url: fleet[0]!.url, fromMs: Number.POSITIVE_INFINITY, toMs: Number.POSITIVE_INFINITY }
  let sentToStalled = 0
  const placed = policy.started.bind(policy)
  policy.started = (a) => {
    const now = performance.now()
    if (a.candidate.route.baseUrl === stalled.url && now > stalled.fromMs + 2000 && now < stalled.toMs)
      sentToStalled++
    placed(a)
  }
  const svc = await buildServices(config, store, () => {}, {}, policy)
  const app = createApp(svc).listen({ port: 0, hostname: '127.0.0.1' })
  const url = `http://127.0.0.1:${app.server!.port}`
  try {
    const post = (path: string, token: string, body: unknown) =>
      fetch(`${url}${path}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      }).then((r) => r.json() as Promise<Record<string, string>>)
    const org = await post('/v1/admin/organizations', ADMIN, { name: 'bench', balance_rub: 1000 })
    const key = (await post('/v1/keys', org.master_key!, { name: 'bench' })).key!
    const ttft: number[] = []
    const warmUpMs = seconds * 100 // the first 10% warms caches and the policy's estimates
    let errors = 0
    let cached = 0
    let prompt = 0
    const setStall = (on: boolean) =>
      fetch(`${control}/stall/0?on=${on ? 1 : 0}${sc.stall?.factor ? `&factor=${sc.stall.factor}` : ''}`, {
        method: 'POST',
      }).then(async (r) => {
        // A fault that was not applied would make the run a plain one under a fault's name.
        if (!r.ok) throw new Error(`the fleet's control refused the fault: ${r.status} ${await r.text()}`)
      })
    const timers: ReturnType<typeof setTimeout>[] = []
    let faultError: unknown
    // The fault goes on at `atS` (before the first request when 0) and off `forS` later; each
    // switch's time is what "sent after 2 s of its fault" counts from.
    const toggle = (on: boolean) =>
      setStall(on).then(() => {
        if (on) stalled.fromMs = performance.now()
        else stalled.toMs = performance.now()
      })
    const at = (on: boolean, s: number) =>
      timers.push(setTimeout(() => void toggle(on).catch((e: unknown) => (faultError ??= e)), s * 1000))
    if (sc.stall) {
      const { atS, forS } = sc.stall
      if (atS === 0) await toggle(true)
      else at(true, atS)
      at(false, atS + forS)
    }
    const started = performance.now()
    const sched = await openLoop(
      { rate, durationMs: seconds * 1000, maxInFlight: 4096, drainMs: 120_000 },
      async (i, intendedAt, signal) => {
        try {
          const res = await fetch(`${url}/v1/chat/completions`, {
            method: 'POST',
            headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
            body: bodies[i % bodies.length],
            signal,
          })
          if (res.status !== 200 || !res.body) {
            errors++
            await res.arrayBuffer()
            return
          }
          const reader = res.body.getReader()
          let first: number | undefined
          let tail = ''
          for (;;) {
            const { done, value } = await reader.read()
            if (done) break
            const chunk = new TextDecoder().decode(value)
            if (first === undefined && chunk.includes('"content"')) first = performance.now()
            tail = (tail + chunk).slice(-2000)
          }
          const u = /"prompt_tokens":(\d+).*?"cached_tokens":(\d+)/.exec(tail)
          if (first === undefined) errors++
          else if (intendedAt - started >= warmUpMs) {
            ttft.push(first - intendedAt)
            if (u) {
              prompt += Number(u[1])
              cached += Number(u[2])
            }
          }
        } catch {
          errors++
        }
      },
    )
    for (const t of timers) clearTimeout(t)
    if (faultError !== undefined) throw faultError
    const sorted = ttft.sort((a, b) => a - b)
    const q = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? Number.NaN
    return {
      policy: name,
      sent: sched.started,
      measured: sorted.length,
      errors,
      meanMs: sorted.reduce((s, x) => s + x, 0) / Math.max(1, sorted.length),
      p50Ms: q(0.5),
      p90Ms: q(0.9),
      p99Ms: q(0.99),
      goodput: sorted.filter((x) => x <= 1000).length / (seconds * 0.9),
      cachedShare: prompt > 0 ? cached / prompt : 0,
      sentToStalled: sc.stall ? sentToStalled : null,
    }
  } finally {
    if (policy instanceof HttpLlmd) policy.stop()
    await app.stop(true)
    await svc.stop()
    await store.close()
    await fleetProc.stop()
    rmSync(dir, { recursive: true, force: true })
  }
}

async function main() {
  const { values } = parseArgs({
    options: {
      'serve-fleet': { type: 'string' },
      fleet: { type: 'string' },
      stall: { type: 'boolean' },
      'stall-seconds': { type: 'string' },
      'fault-at': { type: 'string' },
      slow: { type: 'string' },
      seconds: { type: 'string' },
      load: { type: 'string' },
      policies: { type: 'string' },
      seed: { type: 'string' },
      json: { type: 'string' },
    },
  })
  const fleetName = values.fleet ?? 'mixed'
  const spec = FLEETS[fleetName]
  if (!spec) throw new Error(`unknown fleet ${fleetName}; known: ${Object.keys(FLEETS).join(', ')}`)
  if (values['serve-fleet']) return runFleet(values['serve-fleet'], spec)
  const seconds = Number(values.seconds ?? 40)
  const load = Number(values.load ?? 0.7)
  const seed = Number(values.seed ?? 1)
  const names = values.policies?.split(',') ?? Object.keys(POLICIES)
  for (const name of names)
    if (!POLICIES[name]) throw new Error(`unknown policy ${name}; known: ${Object.keys(POLICIES).join(', ')}`)
  // Capacity as the virtual-time benchmark counts it: every prompt token uncached.
  const promptTokens = 1500 + 150 + 20
  const rate = fleetCapacity(spec, promptTokens, OUT_TOKENS) * load
  const factor = values.slow === undefined ? undefined : Number(values.slow)
  if (factor !== undefined && !(factor > 1)) throw new Error('--slow takes a factor over 1')
  const stall =
    values.stall || factor !== undefined
      ? {
          atS: values['fault-at'] === undefined ? seconds * 0.4 : Number(values['fault-at']),
          forS: Number(values['stall-seconds'] ?? 10),
          ...(factor !== undefined && { factor }),
        }
      : undefined
  const sc: Scenario = { fleet: fleetName, rate, seconds, seed, stall }
  const bodies = requests(Math.ceil(rate * seconds) + 1, 10 + seed)
  console.log(
    `routing over HTTP: ${fleetName} fleet of ${spec.length} simulator nodes, ${rate.toFixed(1)} req/s (${Math.round(load * 100)}% of nominal capacity) for ${seconds} s per policy, seed ${seed}${stall ? `, ${spec[0]!.name} ${stall.factor ? `${stall.factor}x slower` : 'stalled'} ${stall.atS}-${stall.atS + stall.forS} s` : ''}`,
  )
  // The router's tokenizer loads once per process (at its first request, the loop stopped for
  // most of a second): loaded before the first policy, not in whichever policy runs first.
  await warmTokenizer()
  const rows: Row[] = []
  for (const name of names) {
    const row = await runPolicy(name, bodies, sc)
    rows.push(row)
    console.log(
      `  ${name}: mean ${row.meanMs.toFixed(0)} p50 ${row.p50Ms.toFixed(0)} p90 ${row.p90Ms.toFixed(0)} p99 ${row.p99Ms.toFixed(0)} ms, goodput ${row.goodput.toFixed(1)} req/s, ${row.errors} errors, cached ${(row.cachedShare * 100).toFixed(0)}%${row.sentToStalled === null ? '' : `, ${row.sentToStalled} sent to node 0 after 2 s of its fault`}`,
    )
  }
  console.log(
    '\n| policy | mean | p50 | p90 | p99 | goodput (req/s, TTFT <= 1 s) | prompt tokens cached | errors | sent to node 0 after 2 s of its fault |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  )
  for (const r of rows)
    console.log(
      `| ${r.policy} | ${r.meanMs.toFixed(0)} | ${r.p50Ms.toFixed(0)} | ${r.p90Ms.toFixed(0)} | ${r.p99Ms.toFixed(0)} | ${r.goodput.toFixed(1)} | ${(r.cachedShare * 100).toFixed(0)}% | ${r.errors} | ${r.sentToStalled ?? '-'} |`,
    )
  const tropa = rows.find((r) => r.policy === 'tropa')
  const peers = rows.filter((r) => r.policy !== 'tropa')
  let ratios: { mean: number; meanPeer: string; p99: number; p99Peer: string } | undefined
  if (tropa && peers.length > 0) {
    const bestMean = peers.reduce((a, b) => (b.meanMs < a.meanMs ? b : a))
    const bestP99 = peers.reduce((a, b) => (b.p99Ms < a.p99Ms ? b : a))
    ratios = {
      mean: tropa.meanMs / bestMean.meanMs,
      meanPeer: bestMean.policy,
      p99: tropa.p99Ms / bestP99.p99Ms,
      p99Peer: bestP99.policy,
    }
    console.log(
      `\ntropa / best peer: mean ${ratios.mean.toFixed(2)}x (${ratios.meanPeer}), p99 ${ratios.p99.toFixed(2)}x (${ratios.p99Peer})`,
    )
  }
  const file =
    values.json ??
    join(ROOT, '.bench', 'results', `routing-http-${new Date().toISOString().replace(/[:.]/g, '-')}.json`)
  mkdirSync(resolve(file, '..'), { recursive: true })
  writeFileSync(
    file,
    JSON.stringify({ fleet: fleetName, seconds, load, rate, seed, stall, rows, ratios }, null, 1),
  )
  console.log(`JSON: ${file}`)
}

process.on('exit', killAll)
await main()
// Keep-alive sockets to the stopped fleet and the services' timers would hold the process open.
if (!process.argv.includes('--serve-fleet')) process.exit(0)
