import { chownSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir, userInfo } from 'node:os'
import { join } from 'node:path'
import { SQL } from 'bun'
import { createApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config/load.ts'
import { buildServices, consoleLog, type TestHooks } from '../../src/services.ts'
import type { SimNode } from '../../src/simulator/index.ts'
import { openStore } from '../../src/storage/open.ts'
import { freePort } from './process.ts'
import { ADMIN_TOKEN, defaultModels } from './start.ts'

// Shared state a test may break: a Redis server and a PostgreSQL server of its own (the
// machine's shared ones are used by other tests at the same time and must stay up).

async function until(what: string, ok: () => Promise<boolean>, ms = 10_000) {
  const end = Date.now() + ms
  while (Date.now() < end) {
    if (await ok().catch(() => false)) return
    await Bun.sleep(20)
  }
  throw new Error(`${what} did not come up within ${ms} ms`)
}

/** A redis-server child on a free port, no persistence: a restart loses every key. */
export async function startRedisServer() {
  const port = freePort()
  let proc: ReturnType<typeof Bun.spawn> | undefined
  const up = async () => {
    proc = Bun.spawn(
      ['redis-server', '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
      { stdout: 'ignore', stderr: 'ignore' },
    )
    await until('redis-server', async () => {
      const r = Bun.spawnSync(['redis-cli', '-p', String(port), 'PING'])
      return r.stdout.toString().trim() === 'PONG'
    })
  }
  await up()
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    /** kill -9: clients see their connections drop at once. */
    async kill() {
      proc?.kill('SIGKILL')
      await proc?.exited
      proc = undefined
    },
    start: up,
    cli(...args: string[]): string {
      return Bun.spawnSync(['redis-cli', '-p', String(port), ...args])
        .stdout.toString()
        .trim()
    },
    async stop() {
      await this.kill()
    },
  }
}

const PG_BIN = '/usr/lib/postgresql/15/bin'

/**
 * A PostgreSQL server of this test's own (initdb into a temporary directory, a free port), so
 * it can be stopped and started. PostgreSQL refuses to run as root: as root it runs as `postgres`.
 */
export async function startPgServer() {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-pg-'))
  const asRoot = userInfo().uid === 0
  const run = (args: string[]) => {
    const cmd = asRoot ? ['runuser', '-u', 'postgres', '--', ...args] : args
    const r = Bun.spawnSync(cmd, { stdout: 'pipe', stderr: 'pipe' })
    if (r.exitCode !== 0) throw new Error(`${args[0]} failed: ${r.stderr.toString()}${r.stdout.toString()}`)
  }
  if (asRoot) {
    const id = (flag: string) => Number(Bun.spawnSync(['id', flag, 'postgres']).stdout.toString().trim())
    chownSync(dir, id('-u'), id('-g'))
  }
  const port = freePort()
  const data = join(dir, 'data')
  run([`${PG_BIN}/initdb`, '-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8'])
  const opts = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200`
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`
  const start = async () => {
    run([`${PG_BIN}/pg_ctl`, '-D', data, '-o', opts, '-l', join(dir, 'log'), '-w', 'start'])
    await until('postgres', async () => {
      const c = new SQL({ url, max: 1, connectionTimeout: 1 })
      try {
        await c`SELECT 1`
        return true
      } finally {
        await c.close()
      }
    })
  }
  await start()
  return {
    port,
    url,
    start,
    /** Stops at once (like a crash: no checkpoint, clients cut off). */
    stop() {
      run([`${PG_BIN}/pg_ctl`, '-D', data, '-m', 'immediate', '-w', 'stop'])
    },
    async destroy() {
      try {
        this.stop()
      } catch {}
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/** A config file for router nodes sharing `pgUrl` and `redisUrl` (a fresh prefix). */
export function clusterConfig(o: {
  dir: string
  pgUrl: string
  redisUrl: string
  sim: SimNode[]
  redis?: Record<string, unknown>
  storage?: Record<string, unknown>
  extra?: Record<string, unknown>
}): { path: string; prefix: string } {
  const prefix = `tropa-t-${process.pid}-${Date.now().toString(36)}-${Math.floor(Math.random() * 1e6)}:`
  const path = join(o.dir, `tropa-${Math.floor(Math.random() * 1e9)}.json`)
  writeFileSync(
    path,
    JSON.stringify({
      server: { port: 0, data_dir: o.dir, admin_token: ADMIN_TOKEN, log_level: 'error' },
      storage: { kind: 'postgres', postgres_url: o.pgUrl, flush_interval_ms: 10, ...o.storage },
      redis: { url: o.redisUrl, prefix, revocation_bound_ms: 500, ...o.redis },
      ...o.extra,
      models: defaultModels(o.sim),
    }),
  )
  return { path, prefix }
}

/** A router node in this process from a config file (for nodes the test does not need to kill). */
export async function startNode(configPath: string, hooks: TestHooks = {}) {
  const config = loadConfig({ configPath }, {})
  const store = await openStore(config.storage)
  const svc = await buildServices(config, store, consoleLog('error'), {}, undefined, hooks)
  const app = createApp(svc).listen({ port: 0, hostname: '127.0.0.1' })
  return {
    url: `http://127.0.0.1:${app.server!.port}`,
    svc,
    async stop() {
      await app.stop(true)
      await svc.stop()
      await store.close()
    },
  }
}
