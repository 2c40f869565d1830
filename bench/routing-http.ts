/**
 * `bun run bench:routing-http`: the virtual-time routing comparison, smaller, over real HTTP.
 * Tropa (this process, its real request path) routes streamed chat completions to four real
 * simulator nodes in a process of their own (a heterogeneous fleet: 1 fast, 2 medium, 1 slow
 * llama.cpp-like), once per routing policy, each time with a freshly started fleet and the same
 * request sequence. The client measures time to first token from each request's intended start
 * (open loop). Workload: W1-like shared prefixes (8 groups x ~1.5k-token prefix + ~150-token
 * unique suffix, 32 tokens out), at 70% of the fleet's nominal capacity without cache reuse.
 *
 * `--seconds N` (default 40), `--load L` (default 0.7), `--policies a,b` (default all).
 * Internal: `--fleet <out file>` runs the fleet.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { createApp } from '../src/app.ts'
import { loadConfig } from '../src/config/load.ts'
import { LeastInFlight, type RoutingPolicy } from '../src/routing/policy.ts'
import { PredictedTtft } from '../src/routing/predicted.ts'
import { buildServices } from '../src/services.ts'
import { type SimNodeOptions, startSimFleet } from '../src/simulator/index.ts'
import { openStore } from '../src/storage/open.ts'
import { openLoop } from './load.ts'
import { baseEnv, killAll, spawnChild, waitForFile } from './proc.ts'
import { PeakEwma, RoundRobin, SglangCacheAware } from './vt/policies.ts'
import { fleetCapacity, type NodeSpec } from './vt/sim.ts'
import { seeded } from './vt/workloads.ts'

const ROOT = resolve(import.meta.dir, '..')
const ADMIN = 'bench-routing-http-admin-token-0123'
const OUT_TOKENS = 32
const GROUPS = 8

/** The fleet: the virtual-time fleet's node kinds, one fast, two medium, one slow. */
const FLEET: readonly (NodeSpec & { cacheBlocks: number })[] = [
  node('fast-1', 'fast', 20_000, 15, 64, 8192, 1, 40_000),
  node('medium-1', 'medium', 8_000, 25, 32, 4096, 1, 12_000),
  node('medium-2', 'medium', 8_000, 25, 32, 4096, 1, 12_000),
  node('slow-1', 'slow', 2_500, 40, 4, 512, 1, 1_000),
]

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

const POLICIES: Record<string, () => RoutingPolicy> = {
  'round-robin': () => new RoundRobin(),
  'least-busy': () => new LeastInFlight(),
  'peak-ewma': () => new PeakEwma(seeded(7)),
  'sglang-cache-aware': () => new SglangCacheAware(),
  tropa: () => new PredictedTtft({ rng: seeded(7) }),
}

async function runFleet(out: string) {
  const fleet = await startSimFleet(
    FLEET.map(
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
  writeFileSync(out, JSON.stringify(fleet.nodes.map((n) => ({ name: n.name, url: n.url }))))
  const stop = async () => {
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
}

async function runPolicy(name: string, bodies: string[], rate: number, seconds: number): Promise<Row> {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-routing-http-'))
  const fleetFile = join(dir, 'fleet.json')
  const fleetProc = spawnChild({
    name: `fleet-${name}`,
    cmd: ['bun', join(ROOT, 'bench/routing-http.ts'), '--fleet', fleetFile],
    cwd: ROOT,
    env: baseEnv(),
    logDir: dir,
  })
  const fleet = JSON.parse(await waitForFile(fleetFile, fleetProc, 20_000)) as { name: string; url: string }[]
  const configPath = join(dir, 'tropa.json')
  writeFileSync(
    configPath,
    JSON.stringify({
      server: { port: 0, data_dir: dir, admin_token: ADMIN, log_level: 'error', billing: false },
      routing: { health_check_ms: 0, metrics_poll_ms: 0, hedge_share: 0 },
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
  const svc = await buildServices(config, store, () => {}, {}, POLICIES[name]!())
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
    }
  } finally {
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
      fleet: { type: 'string' },
      seconds: { type: 'string' },
      load: { type: 'string' },
      policies: { type: 'string' },
      json: { type: 'string' },
    },
  })
  if (values.fleet) return runFleet(values.fleet)
  const seconds = Number(values.seconds ?? 40)
  const load = Number(values.load ?? 0.7)
  const names = values.policies?.split(',') ?? Object.keys(POLICIES)
  // Capacity as the virtual-time benchmark counts it: every prompt token uncached.
  const promptTokens = 1500 + 150 + 20
  const rate = fleetCapacity(FLEET, promptTokens, OUT_TOKENS) * load
  const bodies = requests(Math.ceil(rate * seconds) + 1, 11)
  console.log(
    `routing over HTTP: ${FLEET.length} simulator nodes, ${rate.toFixed(1)} req/s (${Math.round(load * 100)}% of nominal capacity) for ${seconds} s per policy`,
  )
  const rows: Row[] = []
  for (const name of names) {
    if (!POLICIES[name]) throw new Error(`unknown policy ${name}; known: ${Object.keys(POLICIES).join(', ')}`)
    const row = await runPolicy(name, bodies, rate, seconds)
    rows.push(row)
    console.log(
      `  ${name}: mean ${row.meanMs.toFixed(0)} p50 ${row.p50Ms.toFixed(0)} p90 ${row.p90Ms.toFixed(0)} p99 ${row.p99Ms.toFixed(0)} ms, goodput ${row.goodput.toFixed(1)} req/s, ${row.errors} errors, cached ${(row.cachedShare * 100).toFixed(0)}%`,
    )
  }
  console.log(
    '\n| policy | mean | p50 | p90 | p99 | goodput (req/s, TTFT <= 1 s) | prompt tokens cached | errors |\n| --- | --- | --- | --- | --- | --- | --- | --- |',
  )
  for (const r of rows)
    console.log(
      `| ${r.policy} | ${r.meanMs.toFixed(0)} | ${r.p50Ms.toFixed(0)} | ${r.p90Ms.toFixed(0)} | ${r.p99Ms.toFixed(0)} | ${r.goodput.toFixed(1)} | ${(r.cachedShare * 100).toFixed(0)}% | ${r.errors} |`,
    )
  const file =
    values.json ??
    join(ROOT, '.bench', 'results', `routing-http-${new Date().toISOString().replace(/[:.]/g, '-')}.json`)
  mkdirSync(resolve(file, '..'), { recursive: true })
  writeFileSync(file, JSON.stringify({ seconds, load, rate, rows }, null, 1))
  console.log(`JSON: ${file}`)
}

process.on('exit', killAll)
await main()
// Keep-alive sockets to the stopped fleet and the services' timers would hold the process open.
if (!process.argv.includes('--fleet')) process.exit(0)
