import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
} from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import type { FleetName, FleetSpec, FleetUrls } from './fleet.ts'
import type { Endpoint } from './load.ts'
import { ensurePortkey, portkeyCommand, portkeyConfig } from './portkey.ts'
import { baseEnv, type Child, freePort, spawnChild, waitForFile, waitForHttp } from './proc.ts'

/** The contestants, in table order. */
export const CONTESTANTS = [
  'direct',
  'bare',
  'bare-json',
  'tropa',
  'tropa-nobill',
  'tropa-pg',
  'portkey',
] as const
export type ContestantName = (typeof CONTESTANTS)[number]

export const LABELS: Record<ContestantName, string> = {
  direct: 'direct (simulator)',
  bare: 'bare Bun proxy',
  'bare-json': 'bare proxy, JSON read and written again',
  tropa: 'Tropa',
  'tropa-nobill': 'Tropa, billing off',
  'tropa-pg': 'Tropa, PostgreSQL + Redis',
  portkey: 'Portkey 1.15.2',
}

/** Something that answers chat completions for every fleet, and the process to weigh. */
export interface Contestant {
  readonly name: ContestantName
  /** The process whose memory is measured (for direct: the simulator fleet itself). */
  readonly pid: number
  endpoint(fleet: FleetName): Endpoint
  /** The model name to send for a fleet. */
  model(fleet: FleetName): string
  /** One URL for wrk (which cannot round-robin across ports). */
  wrkUrl(fleet: FleetName): string
  stop(): Promise<void>
}

export interface RunContext {
  readonly repoRoot: string
  /** Scratch directory of this run (configs, data dirs, the copied executable, logs). */
  readonly dir: string
  readonly logDir: string
  readonly fleet: FleetUrls
  readonly fleetPid: number
}

const ADMIN_TOKEN = 'bench-admin-token-0123456789abcdef'
const START_TIMEOUT_MS = 20_000

/** Starts the simulator fleet process; returns its node URLs. */
export async function startFleet(
  repoRoot: string,
  dir: string,
  logDir: string,
  spec: FleetSpec,
): Promise<{ child: Child; urls: FleetUrls }> {
  const out = join(dir, `fleet-${Date.now()}.json`)
  const child = spawnChild({
    name: 'fleet',
    cmd: [process.execPath, join(repoRoot, 'bench', 'fleet.ts'), JSON.stringify(spec), out],
    env: baseEnv(),
    cwd: repoRoot,
    logDir,
  })
  const urls = JSON.parse(await waitForFile(out, child, START_TIMEOUT_MS)) as FleetUrls
  return { child, urls }
}

/** Starts one contestant against the run's fleet. */
export async function startContestant(
  name: ContestantName,
  ctx: RunContext,
  tropaBinary: string,
  portkeyDir: string,
): Promise<Contestant> {
  switch (name) {
    case 'direct':
      return direct(ctx)
    case 'bare':
      return bare(ctx)
    case 'bare-json':
      return bare(ctx, 'json')
    case 'tropa':
      return tropa(ctx, tropaBinary, false)
    case 'tropa-nobill':
      return tropa(ctx, tropaBinary, true)
    case 'tropa-pg':
      return tropa(ctx, tropaBinary, false, await sharedState())
    case 'portkey':
      return portkey(ctx, portkeyDir)
  }
}

function direct(ctx: RunContext): Contestant {
  return {
    name: 'direct',
    pid: ctx.fleetPid,
    endpoint: (f) => ({ urls: ctx.fleet[f].map((u) => `${u}/chat/completions`), headers: {} }),
    model: () => 'chat-small',
    wrkUrl: (f) => `${ctx.fleet[f][0]}/chat/completions`,
    stop: async () => {},
  }
}

/**
 * The bare proxy (bare-proxy.ts); `relay`: its variant that reads the upstream's body in
 * JavaScript; `json`: the one that parses the request and the answer and writes them again (a
 * stream relayed as `relay` does), the floor of a router that reads what it bills.
 */
export async function bare(ctx: RunContext, mode: 'plain' | 'relay' | 'json' = 'plain'): Promise<Contestant> {
  const out = join(ctx.dir, `bare-${Date.now()}.port`)
  const script = join(ctx.repoRoot, 'bench', 'bare-proxy.ts')
  const child = spawnChild({
    name: mode === 'plain' ? 'bare' : `bare-${mode}`,
    cmd: [process.execPath, script, JSON.stringify(ctx.fleet), out, ...(mode === 'plain' ? [] : [mode])],
    env: baseEnv(),
    cwd: ctx.repoRoot,
    logDir: ctx.logDir,
  })
  const port = Number(await waitForFile(out, child, START_TIMEOUT_MS))
  const url = (f: FleetName) => `http://127.0.0.1:${port}/${f}/v1/chat/completions`
  return {
    name: mode === 'json' ? 'bare-json' : 'bare',
    pid: child.pid,
    endpoint: (f) => ({ urls: [url(f)], headers: {} }),
    model: () => 'chat-small',
    wrkUrl: url,
    stop: () => child.stop(),
  }
}

/** The config Tropa runs with: one model per fleet, routed over its three nodes, priced. */
export function tropaConfig(fleet: FleetUrls, port: number, dataDir: string): unknown {
  const model = (f: FleetName) => ({
    id: `bench/${f}`,
    context_length: 8192,
    pricing_per_million: { prompt: '30', completion: '60' },
    routes: fleet[f].map((u, i) => ({
      name: `${f}-${i + 1}`,
      base_url: u,
      upstream_model: 'chat-small',
      // The fleet does not queue: let every request through, as the other contestants do.
      max_concurrency: 100_000,
    })),
  })
  return {
    server: { host: '127.0.0.1', port, data_dir: dataDir, log_level: 'warn' },
    models: [model('fast'), model('stream'), model('hold')],
  }
}

/**
 * A fresh PostgreSQL database and Redis key prefix for the shared-state contestant (one Tropa
 * node with `storage = "postgres"` and Redis, as each node of a cluster runs). The server URLs
 * come from TROPA_BENCH_PG_URL / TROPA_BENCH_REDIS_URL, defaulting to this machine's.
 */
async function sharedState(): Promise<SharedState> {
  const adminUrl = process.env.TROPA_BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test'
  const redisUrl = process.env.TROPA_BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
  const { SQL, RedisClient } = await import('bun')
  const admin = new SQL(adminUrl)
  const db = `tropa_bench_${Date.now().toString(36)}`
  try {
    await admin.unsafe(`CREATE DATABASE ${db}`)
  } finally {
    await admin.close()
  }
  const redis = new RedisClient(redisUrl)
  try {
    await redis.send('PING', [])
  } finally {
    redis.close()
  }
  const u = new URL(adminUrl)
  u.pathname = `/${db}`
  return {
    env: {
      TROPA_STORAGE: 'postgres',
      TROPA_POSTGRES_URL: u.toString(),
      TROPA_REDIS_URL: redisUrl,
      TROPA_REDIS_PREFIX: `${db}:`,
    },
    async drop() {
      const a = new SQL(adminUrl)
      try {
        await a.unsafe(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`)
      } finally {
        await a.close()
      }
    },
  }
}

interface SharedState {
  readonly env: Record<string, string>
  drop(): Promise<void>
}

async function tropa(
  ctx: RunContext,
  binary: string,
  noBilling: boolean,
  shared?: SharedState,
): Promise<Contestant> {
  const name: ContestantName = shared ? 'tropa-pg' : noBilling ? 'tropa-nobill' : 'tropa'
  const stamp = `${name}-${Date.now()}`
  const dataDir = join(ctx.dir, stamp)
  mkdirSync(dataDir, { recursive: true })
  const port = freePort()
  const configFile = join(dataDir, 'tropa.json')
  writeFileSync(configFile, JSON.stringify(tropaConfig(ctx.fleet, port, dataDir), null, 2))
  const child = spawnChild({
    name,
    cmd: [binary, '--config', configFile],
    env: baseEnv({
      TROPA_ADMIN_TOKEN: ADMIN_TOKEN,
      ...(noBilling ? { TROPA_BENCH_NO_BILLING: '1' } : {}),
      ...shared?.env,
    }),
    // No stray .env from the repository: Bun would load it into the executable.
    cwd: dataDir,
    logDir: ctx.logDir,
  })
  const base = `http://127.0.0.1:${port}`
  try {
    await waitForHttp(`${base}/ready`, child, START_TIMEOUT_MS, 200)
    const apiKey = await createApiKey(base)
    const auth = { authorization: `Bearer ${apiKey}` }
    return {
      name,
      pid: child.pid,
      endpoint: () => ({ urls: [`${base}/v1/chat/completions`], headers: auth }),
      model: (f) => `bench/${f}`,
      wrkUrl: () => `${base}/v1/chat/completions`,
      stop: async () => {
        await child.stop()
        await shared?.drop().catch(() => {})
      },
    }
  } catch (err) {
    await child.stop()
    await shared?.drop().catch(() => {})
    throw err
  }
}

/** Organization (admin token) -> master key -> API key, through the admin API. */
export async function createApiKey(base: string): Promise<string> {
  const post = async (path: string, token: string, body: unknown) => {
    const res = await fetch(`${base}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    })
    const text = await res.text()
    if (!res.ok) throw new Error(`POST ${path}: ${res.status} ${text.slice(0, 300)}`)
    return JSON.parse(text) as Record<string, unknown>
  }
  // Enough for hundreds of millions of benchmark tokens: the balance must never be what fails.
  const org = await post('/v1/admin/organizations', ADMIN_TOKEN, {
    name: `bench-${Date.now()}`,
    balance_rub: 10_000_000,
  })
  const key = await post('/v1/keys', String(org.master_key), { name: 'bench' })
  return String(key.key)
}

async function portkey(ctx: RunContext, dir: string): Promise<Contestant> {
  const installed = await ensurePortkey(dir)
  if (!installed.ok) throw new Error(`Portkey unavailable: ${installed.reason}`)
  const port = freePort()
  const { cmd, env } = portkeyCommand(dir, port)
  const child = spawnChild({ name: 'portkey', cmd, env: baseEnv(env), cwd: dir, logDir: ctx.logDir })
  const base = `http://127.0.0.1:${port}`
  try {
    await waitForHttp(`${base}/`, child, START_TIMEOUT_MS, 200)
  } catch (err) {
    await child.stop()
    throw err
  }
  const headers = (f: FleetName) => ({ 'x-portkey-config': portkeyConfig(ctx.fleet[f]) })
  return {
    name: 'portkey',
    pid: child.pid,
    endpoint: (f) => ({ urls: [`${base}/v1/chat/completions`], headers: headers(f) }),
    model: () => 'chat-small',
    wrkUrl: () => `${base}/v1/chat/completions`,
    stop: () => child.stop(),
  }
}

/**
 * The executable under test, copied into the run directory so that a rebuild by someone else
 * mid-run cannot swap it out underneath: dist/tropa (built first when missing), or with `build`
 * the working tree compiled straight into the run directory with package.json's build flags.
 */
export async function tropaExecutable(
  repoRoot: string,
  dir: string,
  log: (msg: string) => void,
  build: boolean,
): Promise<{ path: string; note: string }> {
  const dist = join(repoRoot, 'dist', 'tropa')
  const path = resolve(dir, 'tropa')
  if (build || !existsSync(dist)) {
    const out = build ? path : dist
    log(`compiling ${build ? 'the working tree' : 'dist/tropa (missing)'} ...`)
    const pkg = JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as {
      scripts?: Record<string, string>
    }
    const script =
      pkg.scripts?.build ?? 'bun build --compile --minify --bytecode src/main.ts --outfile dist/tropa'
    // The script as `bun run build` runs it (it has steps: the console's assets, then the
    // compile), through a shell, with this Bun first on PATH and the outfile moved here.
    const command = script
      .split(/\s+/)
      .map((a) => (a === 'dist/tropa' ? out : a))
      .join(' ')
    const p = Bun.spawn(['sh', '-c', command], {
      cwd: repoRoot,
      stdout: 'pipe',
      stderr: 'pipe',
      env: { ...process.env, PATH: `${dirname(process.execPath)}:${process.env.PATH ?? ''}` },
    })
    const [, err] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text()])
    if ((await p.exited) !== 0 || !existsSync(out)) throw new Error(`build failed: ${err.slice(-500)}`)
    if (build)
      return { path, note: "the working tree, compiled by this run with package.json's build script" }
  }
  copyFileSync(dist, path)
  chmodSync(path, 0o755)
  const built = statSync(dist).mtimeMs
  const newest = newestMtime(join(repoRoot, 'src'))
  const stale =
    newest > built ? '; older than the newest file in src/ (pass --build to measure the tree)' : ''
  if (stale) log(`warning: dist/tropa${stale}`)
  return { path, note: `dist/tropa, modified ${new Date(built).toISOString()}${stale}` }
}

/** The latest modification time of any file under `dir`. */
function newestMtime(dir: string): number {
  let newest = 0
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name)
    newest = Math.max(newest, e.isDirectory() ? newestMtime(p) : statSync(p).mtimeMs)
  }
  return newest
}

/**
 * Whether TROPA_BENCH_NO_BILLING exists both in the source and in the executable under test
 * (an older executable would reject the unknown variable and exit).
 */
export async function noBillingSupport(repoRoot: string, binary: string): Promise<string | undefined> {
  const inSource = ['src/config/load.ts', 'src/services.ts'].some((f) => {
    const p = join(repoRoot, f)
    return existsSync(p) && Bun.spawnSync(['grep', '-q', 'TROPA_BENCH_NO_BILLING', p]).exitCode === 0
  })
  if (!inSource) return 'n/a: no switch yet'
  if (Bun.spawnSync(['grep', '-qa', 'TROPA_BENCH_NO_BILLING', binary]).exitCode !== 0)
    return 'n/a: dist/tropa predates the switch (run `bun run build`)'
  return undefined
}
