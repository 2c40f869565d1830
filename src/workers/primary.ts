import { mkdirSync } from 'node:fs'
import type { Config } from '../config/load.ts'
import { localMetrics } from '../http/routes/health.ts'
import { type Log, stopOn } from '../log.ts'
import { buildServices, type Services, type ThreadEntries } from '../services.ts'
import { openStore } from '../storage/open.ts'
import type { Store } from '../storage/store.ts'
import { Hub, HubBus } from './hub.ts'
import { PrimaryNodes } from './nodes.ts'
import { type ToPrimary, type ToWorker, WORKER_ENV, WORKER_PORT_ENV } from './protocol.ts'

export interface PrimaryOptions {
  readonly log: Log
  readonly reload: () => Config
  readonly adminToken: (c: Config) => { token: string; generated: boolean }
  readonly threads: ThreadEntries
  /** Tests only: TROPA_TEST_CLOCK_OFFSET_MS, for the primary's meter (budgets' periods). */
  readonly clockOffsetMs: number
}

interface Child {
  proc: ReturnType<typeof Bun.spawn>
  ready: boolean
  startedAtMs: number
  /** A reload came while it was starting: sent (SIGHUP) once it serves. */
  reloadWanted?: boolean
}

/**
 * The primary of `server.workers` processes serving one port. It checks the port is free (a
 * listen without SO_REUSEPORT, so another program on it stops the start), then starts the
 * workers: this executable again with the same arguments and TROPA_WORKER set; they listen on the
 * port with SO_REUSEPORT and the kernel spreads connections over them. On the embedded store it
 * holds what must be counted once for all of them (src/workers/hub.ts) and runs the batches and
 * webhooks' delivery; with PostgreSQL and Redis each worker is a node of the cluster and the
 * primary only watches them. A worker that exits is started again; SIGTERM stops them all.
 */
export async function runPrimary(base: Config, o: PrimaryOptions): Promise<void> {
  const { log } = o
  mkdirSync(base.server.dataDir, { recursive: true, mode: 0o700 })
  const embedded = !base.redis.url
  let store: Store | undefined
  let svc: Services | undefined
  const bus = new HubBus()
  // The admin token first, so the workers read the same one.
  const { token: adminToken, generated } = o.adminToken(base)
  const config: Config = { ...base, server: { ...base.server, adminToken } }
  if (embedded) {
    store = await openStore(config.storage)
    const offset = o.clockOffsetMs
    svc = await buildServices(
      config,
      store,
      log,
      o.threads,
      undefined,
      Number.isFinite(offset) && offset !== 0 ? { clock: () => Date.now() + offset } : {},
      { kind: 'primary', bus },
    )
    svc.loadConfig = o.reload
  }
  const nodes =
    svc &&
    new PrimaryNodes(
      svc.deps.pool,
      () => svc?.batches.scheduler?.wantsNodes ?? false,
      (view) => {
        for (const w of bus.workers.values()) w.send({ bv: view })
      },
    )
  const hub =
    svc &&
    new Hub(
      svc.identity,
      svc.deps.meter,
      svc.deps.limiter,
      svc.deps.concurrency,
      svc.ledger,
      bus,
      () => localMetrics(svc!),
      nodes,
    )

  // The port: free now (no one else listens on it, with or without SO_REUSEPORT), and a real one.
  let port: number
  try {
    const probe = Bun.serve({
      port: config.server.port,
      hostname: config.server.host,
      reusePort: false,
      // Never mistaken for a worker's answer (a /ready poll that came in this moment).
      fetch: () => new Response(null, { status: 503 }),
    })
    port = probe.port!
    probe.stop(true)
  } catch (err) {
    console.error(
      `tropa: cannot listen on ${config.server.host}:${config.server.port}: ${(err as Error).message}`,
    )
    await svc?.stop()
    await store?.close()
    process.exit(1)
  }

  const cmd = Bun.main.startsWith('/$bunfs/')
    ? [process.execPath, ...process.argv.slice(2)]
    : [process.execPath, ...process.execArgv, Bun.main, ...process.argv.slice(2)]
  const children = new Map<number, Child>()
  let stopping = false
  let started!: () => void
  let failedToStart!: (err: Error) => void
  const allReady = new Promise<void>((resolve, reject) => {
    started = resolve
    failedToStart = reject
  })
  let starting = true
  /** Restarts in a row of a worker that died young: each waits longer (up to 30 s). */
  const quickDeaths = new Map<number, number>()

  const spawn = (i: number) => {
    const proc = Bun.spawn(cmd, {
      env: { ...process.env, [WORKER_ENV]: String(i), [WORKER_PORT_ENV]: String(port) },
      stdio: ['ignore', 'inherit', 'inherit'],
      serialization: 'advanced',
      ipc: (m: ToPrimary | ToPrimary[]) => {
        if (Array.isArray(m)) {
          // A worker's POST /v1/admin/reload: the primary and the other workers reload too.
          if (m.some((x) => 'op' in x && x.op === 'reloaded')) reloadAll(i)
          hub?.receiveAll(i, m)
          return
        }
        if ('ready' in m) {
          const c = children.get(i)
          if (c) c.ready = true
          if (c?.reloadWanted) {
            c.reloadWanted = false
            c.proc.kill('SIGHUP')
          }
          if (starting && [...children.values()].every((x) => x.ready)) started()
          return
        }
      },
    })
    const child: Child = { proc, ready: false, startedAtMs: Date.now() }
    children.set(i, child)
    hub?.attach(i, (batch: ToWorker[]) => {
      try {
        proc.send(batch)
      } catch {
        // gone: its exit is handled below
      }
    })
    void proc.exited.then((code) => {
      const gave = hub?.detach(i)
      if (children.get(i) === child) children.delete(i)
      if (stopping) return
      if (starting && !child.ready) {
        failedToStart(new Error(`worker ${i} exited with ${code} while starting`))
        return
      }
      const young = Date.now() - child.startedAtMs < 5000
      const n = young ? (quickDeaths.get(i) ?? 0) + 1 : 0
      quickDeaths.set(i, n)
      const delay = n === 0 ? 0 : Math.min(30_000, 250 * 2 ** n)
      log('error', 'a worker exited; starting another', {
        worker: i,
        code,
        holds_released: gave?.holds ?? 0,
        slots_released: gave?.slots ?? 0,
        in_ms: delay,
      })
      setTimeout(() => {
        if (!stopping) spawn(i)
      }, delay)
    })
  }

  /** One worker reloaded its config (POST /v1/admin/reload): so do the others and the primary. */
  const reloadAll = (from: number) => {
    try {
      svc?.reload()
    } catch {
      // logged by reload()
    }
    // A worker still loading its code has no SIGHUP handler yet, and the signal's default would
    // end it (and, while the workers start, the start): it gets the reload once it serves.
    for (const [i, c] of children)
      if (i === from) continue
      else if (c.ready) c.proc.kill('SIGHUP')
      else c.reloadWanted = true
  }
  // Before the workers start: a SIGHUP while they do reloads (a worker still starting keeps it
  // for when it serves) rather than ending the primary, the signal's default.
  process.on('SIGHUP', () => reloadAll(-1))

  const n = config.server.workers
  for (let i = 0; i < n; i++) spawn(i)
  // A worker that neither listens nor exits within a minute stops the start too.
  const slow = setTimeout(
    () => failedToStart(new Error('the workers did not all listen within 60 s')),
    60_000,
  )
  try {
    await allReady
    clearTimeout(slow)
  } catch (err) {
    stopping = true
    console.error(`tropa: ${(err as Error).message}`)
    for (const c of children.values()) c.proc.kill('SIGKILL')
    await Promise.all([...children.values()].map((c) => c.proc.exited))
    await svc?.stop()
    await store?.close()
    process.exit(1)
  }
  starting = false
  const url = `http://${config.server.host}:${port}`
  log('info', 'tropa listening', {
    url,
    workers: n,
    config: config.source,
    data_dir: config.server.dataDir,
    models: config.models.map((m) => `${m.id} (${m.routes.length} routes)`),
  })
  if (generated)
    console.log(
      `Admin token (shown once; stored in ${config.server.dataDir}/admin-token):\n  ${adminToken}\n`,
    )

  // SIGTERM or SIGINT: every worker stops gracefully (its in-flight requests finish), batches
  // drain meanwhile; then the ledger is flushed and the store closed. A second signal: at once.
  const stop = async (signal: string) => {
    if (stopping) {
      log('warn', `second ${signal}: exiting at once`)
      for (const c of children.values()) c.proc.kill('SIGKILL')
      process.exit(1)
    }
    stopping = true
    const graceMs = config.server.shutdownGraceMs
    log('info', 'stopping: in-flight requests may finish', {
      signal,
      grace_ms: graceMs,
      workers: children.size,
    })
    const procs = [...children.values()].map((c) => c.proc)
    for (const p of procs) p.kill('SIGTERM')
    const batches = svc?.drain(Date.now() + graceMs)
    // A worker past its grace and its own second's cut is killed.
    const late = setTimeout(() => {
      for (const p of procs) p.kill('SIGKILL')
    }, graceMs + 5000)
    await Promise.all(procs.map((p) => p.exited))
    clearTimeout(late)
    await batches
    await svc?.stop()
    await store?.close()
    log('info', 'stopped')
    process.exit(0)
  }
  stopOn(['SIGINT', 'SIGTERM'], stop, log)
}
