/**
 * `bun bench/request-path.ts [--rounds N] [--per N] [--prompt-bytes N [--unique]] <tree> [<tree> ...]`: the event loop's CPU per
 * pass-through chat request of each source tree (a worktree of any commit, its `bun install`
 * done), all in one process, with no network: each tree's whole app (`createApp(...).handle`,
 * body check, count, reserve, route, relay, settle, ledger row) answers a non-streamed 16-token
 * completion whose upstream adapter is replaced by one returning a fixed OpenAI reply. Rounds
 * alternate the trees (the order rotating), 32 requests in flight; CPU time of this thread from
 * CLOCK_THREAD_CPUTIME_ID. Prints each tree's median and the first tree's ratio to every other:
 * the mean of the rounds' ratios with its standard error. Finer than `bench:money --against`
 * (no HTTP server, fetch or load generator on the same cores), which it complements. `--quick`:
 * 2 rounds of 200 (the smoke). The trees' own node_modules must be their own (not symlinks to one
 * another's), or they share one Elysia.
 *
 * A tree may carry config to merge into the bench's own, after a `#`: `'.#{"console":{"enabled":false}}'`
 * measures this tree with the console off, against `.` with it on. `{{node}}` in that JSON is the
 * stub node's base URL (`{"tracing":{"endpoint":"{{node}}/traces"}}`: traces exported to it).
 */
import { dlopen, FFIType, ptr } from 'bun:ffi'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { benchChatBody, merged } from './stub-router.ts'

const ADMIN = 'bench-admin-token-0123456789abcdef'
const REPLY = JSON.stringify({
  id: 'chatcmpl-sim-1',
  object: 'chat.completion',
  created: 1764000000,
  model: 'chat-small',
  choices: [
    {
      index: 0,
      message: {
        role: 'assistant',
        content: 'Routers queue requests and send each one where it will be answered soonest, they',
      },
      finish_reason: 'length',
    },
  ],
  usage: { prompt_tokens: 16, completion_tokens: 16, total_tokens: 32 },
})
// The request of bench/load.ts chatBody, as wrk sends it in bench:money; with --prompt-bytes N,
// its prompt N bytes of English words (as bench/workers.ts sends).
const bodyOf = (promptBytes: number) => benchChatBody(promptBytes, { seed: 1, stream: false })
let BODY = bodyOf(0)
let UNIQUE = false
/** What --unique overwrites in the body: the prompt's first 12 characters. */
const UNIQUE_AT = /(?<="content":")[^"]{12}/

const libc = dlopen('libc.so.6', {
  clock_gettime: { args: [FFIType.i32, FFIType.ptr], returns: FFIType.i32 },
})
const ts = new BigInt64Array(2)
const CLOCK_THREAD_CPUTIME_ID = 3
/** This thread's CPU time, microseconds. */
function threadCpuUs(): number {
  libc.symbols.clock_gettime(CLOCK_THREAD_CPUTIME_ID, ptr(ts))
  return Number(ts[0]!) * 1e6 + Number(ts[1]!) / 1000
}

// biome-ignore lint/suspicious/noExplicitAny: the trees are loaded by path, of any commit
type Any = any

/** One tree's app, with a key, answering from a stub upstream; `one()` is one request. */
async function setup(spec: string, nodeUrl: string) {
  const at = spec.indexOf('#')
  const tree = at < 0 ? spec : spec.slice(0, at)
  const extra = at < 0 ? {} : JSON.parse(spec.slice(at + 1).replaceAll('{{node}}', nodeUrl))
  const load = (p: string) => import(join(tree, p)) as Promise<Any>
  const { createApp } = await load('src/app.ts')
  const { loadConfig } = await load('src/config/load.ts')
  const { buildServices, consoleLog } = await load('src/services.ts')
  const { openStore } = await load('src/storage/open.ts')
  const { loadTokenizer } = await load('src/pipeline/tokens.ts')
  const dir = mkdtempSync(join(tmpdir(), 'tropa-request-path-'))
  const configPath = join(dir, 'tropa.json')
  writeFileSync(
    configPath,
    JSON.stringify(
      merged(
        {
          server: { host: '127.0.0.1', port: 0, data_dir: dir, log_level: 'error', admin_token: ADMIN },
          // The ledger thread may fall behind a loop this fast: its queue must not refuse (503).
          storage: { ledger_queue_max: 5_000_000 },
          models: [
            {
              id: 'bench/fast',
              context_length: 8192,
              pricing_per_million: { prompt: '30', completion: '60' },
              routes: [1, 2, 3].map((i) => ({
                name: `fast-${i}`,
                base_url: nodeUrl,
                upstream_model: 'chat-small',
                max_concurrency: 100_000,
              })),
            },
          ],
        },
        extra,
      ),
    ),
  )
  const config = loadConfig({ configPath }, {})
  const svc = await buildServices(config, await openStore(config.storage), consoleLog('error'))
  await loadTokenizer()
  svc.deps.adapter = {
    send: async (_call: unknown, controller: AbortController) => ({
      response: new Response(REPLY, { headers: { 'content-type': 'application/json' } }),
      abort: (r: unknown) => controller.abort(r),
    }),
  }
  const app = createApp(svc)
  const post = async (path: string, token: string, b: unknown) =>
    (await app.handle(
      new Request(`http://localhost${path}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify(b),
      }),
    )) as Response
  const org = await (
    await post('/v1/admin/organizations', ADMIN, { name: 'b', balance_rub: 10_000_000 })
  ).json()
  const key = (await (await post('/v1/keys', org.master_key, { name: 'k' })).json()).key as string
  const headers = {
    authorization: `Bearer ${key}`,
    'content-type': 'application/json',
    'content-length': String(BODY.length),
    host: 'localhost',
    'user-agent': 'wrk',
  }
  let sent = 0
  const one = async () => {
    // --unique: each prompt's first 12 characters a number of its own (the same length).
    const body = UNIQUE ? BODY.replace(UNIQUE_AT, `${String(++sent).padStart(11, '0')} `) : BODY
    const res = (await app.handle(
      new Request('http://localhost/v1/chat/completions', { method: 'POST', headers, body }),
    )) as Response
    if (res.status !== 200) throw new Error(`${tree}: ${res.status} ${await res.text()}`)
    await res.text()
  }
  return { tree: spec, one }
}

async function run(one: () => Promise<void>, n: number, inFlight = 32): Promise<void> {
  let left = n
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (left-- > 0) await one()
    }),
  )
}

const median = (xs: readonly number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!

export interface RequestPathReport {
  rounds: number
  perRound: number
  trees: { tree: string; medianUs: number }[]
  /** The first tree against each other: mean of the rounds' ratios - 1, its standard error, median. */
  ratios: { against: string; mean: number; se: number; median: number }[]
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      rounds: { type: 'string' },
      per: { type: 'string' },
      quick: { type: 'boolean' },
      json: { type: 'string' },
      'prompt-bytes': { type: 'string' },
      unique: { type: 'boolean' },
    },
  })
  BODY = bodyOf(Number(values['prompt-bytes'] ?? 0))
  UNIQUE = values.unique === true
  const quick = values.quick === true
  const rounds = Number(values.rounds ?? (quick ? 2 : 48))
  const per = Number(values.per ?? (quick ? 200 : 3000))
  const trees = (positionals.length > 0 ? positionals : ['.']).map((t) => {
    const at = t.indexOf('#')
    return at < 0 ? resolve(t) : `${resolve(t.slice(0, at))}${t.slice(at)}`
  })
  // A node that answers the routes' probes; the chat requests never reach it.
  const node = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response('{"data":[]}') })
  const sides = []
  for (const t of trees) sides.push(await setup(t, `http://127.0.0.1:${node.port}/v1`))
  for (const s of sides) await run(s.one, quick ? 200 : 20_000)
  const cpu = sides.map(() => [] as number[])
  for (let r = 0; r < rounds; r++) {
    const k = sides.length
    const order = [...sides.keys()].map((i) => (i + r) % k)
    if (Math.floor(r / k) % 2) order.reverse()
    for (const i of order) {
      const c0 = threadCpuUs()
      await run(sides[i]!.one, per)
      cpu[i]!.push((threadCpuUs() - c0) / per)
    }
  }
  const report: RequestPathReport = {
    rounds,
    perRound: per,
    trees: sides.map((s, i) => ({ tree: s.tree, medianUs: median(cpu[i]!) })),
    ratios: sides.slice(1).map((s, j) => {
      const rs = cpu[0]!.map((x, i) => x / cpu[j + 1]![i]! - 1)
      const mean = rs.reduce((a, b) => a + b, 0) / rs.length
      const se = Math.sqrt(
        rs.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, rs.length - 1) / rs.length,
      )
      return { against: s.tree, mean, se, median: median(rs) }
    }),
  }
  for (const t of report.trees)
    console.log(
      `${t.tree}: ${t.medianUs.toFixed(2)} us event-loop CPU per request (median of ${rounds} rounds)`,
    )
  for (const r of report.ratios)
    console.log(
      `${trees[0]} / ${r.against} - 1: ${(r.mean * 100).toFixed(1)}% ± ${(r.se * 100).toFixed(1)}% (mean of rounds ± se), median ${(r.median * 100).toFixed(1)}%`,
    )
  if (values.json) writeFileSync(values.json, JSON.stringify(report, null, 2))
  node.stop(true)
  process.exit(0)
}

if (import.meta.main) await main()
