#!/usr/bin/env bun
// First, before the router's modules load: its runtime setting (cli/tuned-runtime.ts).
import './cli/tuned-start.ts'
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { createApp } from './app.ts'
import { runBatchesCommand } from './cli/batches.ts'
import { runReceiptsCommand } from './cli/receipts.ts'
import { runStoreCommand } from './cli/store.ts'
import { type Config, ConfigError, loadConfig, TEST_CLOCK_ENV } from './config/load.ts'
import { localMetrics } from './http/routes/health.ts'
import { randomBase62 } from './ids.ts'
import { stopOn } from './log.ts'
import { buildServices, consoleLog, type ThreadEntries } from './services.ts'
import { openStore } from './storage/open.ts'
import { SqliteStoreUnusable } from './storage/sqlite/check.ts'
import { VERSION } from './version.ts'
import { mergeMetrics } from './workers/metrics.ts'
import { WorkerNodes } from './workers/nodes.ts'
import { runPrimary } from './workers/primary.ts'
import { type ToWorker, WORKER_ENV, WORKER_PORT_ENV } from './workers/protocol.ts'
import { PrimaryLink } from './workers/worker.ts'

const HELP = `tropa ${VERSION}: an OpenAI-compatible model router with hard spending limits in roubles

Usage:
  tropa [serve] [flags]     start the router (the default subcommand)
  tropa sim [flags]         run simulated OpenAI-compatible upstream nodes (tropa sim --help)
  tropa batches watch <id>  follow a batch with a progress bar (tropa batches --help)
  tropa store check         check the SQLite store's file for damage (tropa store --help)
  tropa receipts verify <file> --keys <url|file>
                            check the receipts of a ledger export offline (tropa receipts --help)
  tropa help | --help       this text
  tropa version | --version

Flags of serve:
  --demo                    embedded default: SQLite in the data dir, an in-process simulated
                            fleet (3 nodes, sim/chat-small and sim/embed-small), a demo
                            organization; prints keys and a curl (also TROPA_DEMO=1)
  --config <file>           config file, TOML or JSON (also TROPA_CONFIG); see docs/config.md
  --port <n>                listen port, default 8080 (also TROPA_PORT; 0 picks a free one)
  --host <addr>             listen address, default 127.0.0.1 (also TROPA_HOST)
  --data-dir <dir>          data directory, default ./tropa-data (also TROPA_DATA_DIR)

Environment: TROPA_ADMIN_TOKEN sets the admin token; without it the embedded default generates
one at first start into <data-dir>/admin-token (mode 0600) and prints it once.
OTEL_EXPORTER_OTLP_ENDPOINT (and OpenTelemetry's other standard variables) turns on request
traces over OTLP/HTTP (docs/observability.md).

Signals: SIGTERM or SIGINT stops gracefully (in-flight requests finish within
server.shutdown_grace_ms; a second signal exits at once); SIGHUP reloads the config file's
models, routes and prices (also POST /v1/admin/reload).`

async function main(argv: string[]): Promise<void> {
  const [first, ...rest] = argv
  // The simulator and the demo are imported only when used: a router of real upstreams never
  // loads them.
  if (first === 'sim') return (await import('./simulator/cli.ts')).runSimCommand(rest)
  if (first === 'batches') return runBatchesCommand(rest)
  if (first === 'store') return runStoreCommand(rest)
  if (first === 'receipts') return runReceiptsCommand(rest)
  if (first === 'help' || first === '--help' || first === '-h') return void console.log(HELP)
  if (first === 'version' || first === '--version') return void console.log(VERSION)
  const args = first === 'serve' ? rest : argv
  let values: ReturnType<typeof parseFlags>
  try {
    values = parseFlags(args)
  } catch (err) {
    console.error(`tropa: ${(err as Error).message}\n\n${HELP}`)
    process.exit(2)
  }
  if (values.help) return void console.log(HELP)
  const port = values.port === undefined ? undefined : Number(values.port)
  if (port !== undefined && (!Number.isInteger(port) || port < 0 || port > 65535)) {
    console.error(`tropa: --port must be an integer from 0 to 65535, not ${values.port}`)
    process.exit(2)
  }
  let config: Config
  try {
    config = loadConfig({
      configPath: values.config,
      port,
      host: values.host,
      dataDir: values['data-dir'],
      demo: values.demo,
    })
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(`tropa: ${err.message}`)
      process.exit(2)
    }
    throw err
  }
  // A reload reads the file again with the same flags and environment.
  const reload = () =>
    loadConfig({
      configPath: values.config,
      port,
      host: values.host,
      dataDir: values['data-dir'],
      demo: values.demo,
    })
  await serve(config, reload)
}

function parseFlags(args: string[]) {
  return parseArgs({
    args,
    options: {
      demo: { type: 'boolean' },
      config: { type: 'string' },
      port: { type: 'string' },
      host: { type: 'string' },
      'data-dir': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
    allowPositionals: false,
  }).values
}

async function serve(base: Config, reload: () => Config): Promise<void> {
  const index = process.env[WORKER_ENV]
  // A worker's primary may send SIGHUP (a reload) while this worker is still starting: kept, and
  // done once the worker serves, instead of the signal's default (the process ends).
  let reloadAsked = false
  const early = () => {
    reloadAsked = true
  }
  if (index !== undefined) process.on('SIGHUP', early)
  // Several processes on the port: this one starts and watches them (docs/workers.md).
  if (index === undefined && base.server.workers > 1)
    return runPrimary(base, {
      log: consoleLog(base.server.logLevel),
      reload,
      adminToken: (c) => adminTokenOf(c),
      threads: threadEntries(),
      clockOffsetMs: Number(process.env[TEST_CLOCK_ENV] ?? 0),
    })
  // One of them: with PostgreSQL and Redis each is a node of the cluster; on the embedded store
  // its primary holds the money, the limits and the ledger for all of them.
  const link =
    index !== undefined && !base.redis.url
      ? new PrimaryLink((batch) => void process.send?.(batch))
      : undefined
  if (index !== undefined) {
    process.on('message', (batch: ToWorker[]) => link?.receiveAll(batch))
    // The primary is gone (killed): so is what held this worker's money; stop at once.
    process.on('disconnect', () => {
      link?.lost()
      console.error(`tropa: worker ${index}: its primary is gone; exiting`)
      process.exit(1)
    })
  }
  const plain = consoleLog(base.server.logLevel)
  // A worker's lines say which worker wrote them.
  const log: typeof plain =
    index === undefined
      ? plain
      : (level, msg, fields) => plain(level, msg, { worker: Number(index), ...fields })
  mkdirSync(base.server.dataDir, { recursive: true, mode: 0o700 })
  // The store first: a damaged one stops the start before anything is generated or started.
  const store = await openStore(base.storage)
  const demo = base.demo.enabled ? await import('./demo.ts') : undefined
  const fleet = demo && base.models.length === 0 ? await demo.startDemoFleet(base.demo.nodes) : undefined
  const models = demo && fleet ? demo.demoModels(fleet.nodes) : base.models
  const { token: adminToken, generated } = adminTokenOf(base)
  const config: Config = { ...base, models, server: { ...base.server, adminToken } }
  // Tests only: a clock ahead of (or behind) the real one for period budgets, so a test of a
  // kill -9 crosses a budget's period boundary in seconds (docs/billing.md).
  const offset = Number(process.env[TEST_CLOCK_ENV] ?? 0)
  const svc = await buildServices(
    config,
    store,
    log,
    threadEntries(),
    undefined,
    Number.isFinite(offset) && offset !== 0 ? { clock: () => Date.now() + offset } : {},
    link
      ? { kind: 'worker', link, index: Number(index) }
      : index !== undefined
        ? { kind: 'node', index: Number(index) }
        : undefined,
  )
  svc.loadConfig = () => {
    // The demo's models are generated for its in-process fleet; only a config file's reload.
    if (fleet)
      throw new ConfigError(['the demo fleet was started without a config file: there is nothing to reload'])
    return reload()
  }
  if (link) {
    // The primary runs the batches, this worker interactive requests: each tells the other of its
    // own on the nodes, so that a batch yields here as in one process (src/workers/nodes.ts).
    const nodes = new WorkerNodes(svc.deps.pool, (reports) => link.tell('nodes', reports))
    link.onBatchView((view) => nodes.apply(view))
    link.metricsHere = () => localMetrics(svc, { worker: true })
    svc.gatherMetrics = () =>
      link
        .call<{ worker: string; text: string }[]>('metrics')
        .then(mergeMetrics, () => localMetrics(svc, { worker: true }))
  }
  // SIGHUP reloads this process only (the primary sends it to each worker).
  let reloadHere = () => svc.reload()
  if (link) {
    // POST /v1/admin/reload on one worker: the primary reloads itself and the other workers.
    const own = svc.reload.bind(svc)
    reloadHere = own
    svc.reload = () => {
      const report = own()
      link.tell('reloaded')
      return report
    }
  }
  // SIGHUP reloads models, routes and prices; an invalid file is logged and changes nothing.
  const onHup = () => {
    try {
      reloadHere()
    } catch {
      // logged by reload(), with every problem
    }
  }
  process.off('SIGHUP', early)
  process.on('SIGHUP', onHup)
  if (reloadAsked) onHup()
  const workerPort = index === undefined ? undefined : Number(process.env[WORKER_PORT_ENV])
  const app = createApp(svc, { reusePort: index !== undefined }).listen({
    port: workerPort ?? config.server.port,
    hostname: config.server.host,
  })
  const baseUrl = `http://${config.server.host}:${app.server?.port}`
  if (index !== undefined) process.send?.({ ready: app.server!.port })
  log(index === undefined ? 'info' : 'debug', index === undefined ? 'tropa listening' : 'worker listening', {
    url: baseUrl,
    config: config.source,
    data_dir: config.server.dataDir,
    models: models.map((m) => `${m.id} (${m.routes.length} routes)`),
  })

  // A graceful stop: refuse new connections, let requests and streams finish until
  // server.shutdown_grace_ms, then end the streams still open with an error event (each billed
  // for what it was sent); flush the ledger, give back batch leases. A second signal exits now.
  const server = app.server!
  let stopping = false
  const stop = async (signal: string) => {
    if (stopping) {
      log('warn', `second ${signal}: exiting at once`)
      process.exit(1)
    }
    stopping = true
    const graceMs = config.server.shutdownGraceMs
    log('info', 'stopping: in-flight requests may finish', {
      signal,
      grace_ms: graceMs,
      streams: svc.deps.streams.size,
    })
    const drained = server.stop(false)
    const batches = svc.drain(Date.now() + graceMs)
    let timer: ReturnType<typeof setTimeout> | undefined
    const late = await Promise.race([
      drained.then(() => false),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(true), graceMs)
      }),
    ])
    clearTimeout(timer)
    if (late) {
      const ended = svc.deps.streams.endAll()
      log('warn', 'stop deadline passed: open streams ended', { streams: ended })
      // A moment for the ended streams' last event to go out; what is still open then is cut.
      await Promise.race([drained, Bun.sleep(1000)])
      await server.stop(true)
    }
    await batches
    await svc.stop()
    await store.close()
    await fleet?.stop()
    log('info', 'stopped')
    process.exit(0)
  }
  // A worker is stopped and reloaded by its primary (a terminal's Ctrl-C reaches the whole group).
  if (index !== undefined) process.on('SIGINT', () => {})
  stopOn(index === undefined ? ['SIGINT', 'SIGTERM'] : ['SIGTERM'], stop, log)

  if (generated)
    console.log(
      `Admin token (shown once; stored in ${join(config.server.dataDir, 'admin-token')}):\n  ${adminToken}\n`,
    )
  if (demo) {
    const { creds, file } = await demo.ensureDemoOrg(svc, config, baseUrl, adminToken)
    console.log(`Tropa demo is running at ${baseUrl}/v1
  models:     ${models.map((m) => m.id).join(', ')} on ${fleet?.nodes.length ?? 0} simulated nodes
  master key: ${creds.master_key}   (manages API keys: /v1/keys)
  API key:    ${creds.api_key}
  credentials as JSON: ${file}${config.console.enabled ? `\n  web console: ${baseUrl}/console (sign in with the master key)` : ''}

Try it:
  curl -s ${baseUrl}/v1/chat/completions \\
    -H "Authorization: Bearer ${creds.api_key}" -H "Content-Type: application/json" \\
    -d '{"model":"sim/chat-small","messages":[{"role":"user","content":"Hello!"}]}'
`)
  }
}

/**
 * The worker threads' entry points. Inside the executable they are further entries of the build,
 * at a fixed path in Bun's embedded file system; with --bytecode, import.meta.url names the
 * source file on disk instead, so a relative URL would load (or miss) files outside the binary.
 */
function threadEntries(): ThreadEntries {
  const inBinary = Bun.main.startsWith('/$bunfs/')
  return {
    batchWorker: inBinary
      ? '/$bunfs/root/batches/worker.js'
      : new URL('./batches/worker.ts', import.meta.url),
    ledgerThread: inBinary
      ? '/$bunfs/root/billing/ledger-thread.js'
      : new URL('./billing/ledger-thread.ts', import.meta.url),
    receiptThread: inBinary
      ? '/$bunfs/root/billing/receipt-thread.js'
      : new URL('./billing/receipt-thread.ts', import.meta.url),
  }
}

/** The admin token: configured, or (embedded default) generated once into the data dir. */
export function adminTokenOf(cfg: Config): { token: string; generated: boolean } {
  if (cfg.server.adminToken) return { token: cfg.server.adminToken, generated: false }
  const file = join(cfg.server.dataDir, 'admin-token')
  if (existsSync(file)) return { token: readFileSync(file, 'utf8').trim(), generated: false }
  const token = `admin-${randomBase62(40)}`
  writeFileSync(file, `${token}\n`, { mode: 0o600 })
  chmodSync(file, 0o600)
  return { token, generated: true }
}

if (import.meta.main) {
  main(process.argv.slice(2)).catch((err) => {
    // A store Tropa will not use is an operator's matter, not a bug: the message says it all.
    if (err instanceof SqliteStoreUnusable) {
      console.error(`tropa: ${err.message}`)
      process.exit(1)
    }
    console.error(`tropa: ${(err as Error)?.stack ?? err}`)
    process.exit(1)
  })
}
