import { BatchScheduler } from './batches/scheduler.ts'
import { BatchService, LinkSigner } from './batches/service.ts'
import { LedgerWriter } from './billing/ledger.ts'
import { Meter, type MoneyMeter } from './billing/meter.ts'
import { RateLimiter } from './billing/rate-limiter.ts'
import { SharedMeter } from './billing/shared-meter.ts'
import { Catalogue } from './catalogue/catalogue.ts'
import { RedisBus } from './cluster/bus.ts'
import type { Config } from './config/load.ts'
import { LocalFileStore } from './files/file-store.ts'
import { FilesService } from './files/service.ts'
import { IdentityService } from './identity/service.ts'
import { randomBase62 } from './ids.ts'
import type { ChatDeps } from './pipeline/chat.ts'
import { NodePool } from './routing/nodes.ts'
import { LeastInFlight } from './routing/policy.ts'
import type { Store } from './storage/store.ts'
import { OpenAICompatibleAdapter } from './upstream/openai-compatible.ts'
import { Watchdog } from './upstream/watchdog.ts'

export type LogLevel = 'debug' | 'info' | 'warn' | 'error'
export type Log = (level: LogLevel, msg: string, fields?: Record<string, unknown>) => void

/** Everything the HTTP layer calls, built once by main.ts (or a test) from a config and a store. */
export interface Services {
  readonly config: Config
  readonly store: Store
  readonly identity: IdentityService
  readonly deps: ChatDeps
  readonly ledger: LedgerWriter
  readonly files: FilesService
  readonly batches: BatchService
  readonly log: Log
  /** Flushes the ledger and stops timers; the store is closed by whoever opened it. */
  stop(): Promise<void>
}

/** `workerUrl`: the batch worker's entry, as main.ts sees it (needed inside the executable). */
export async function buildServices(
  config: Config,
  store: Store,
  log: Log,
  workerUrl?: string | URL,
): Promise<Services> {
  const bus = config.redis.url
    ? new RedisBus(
        config.redis.url,
        config.redis.prefix,
        `node-${randomBase62(8)}`,
        config.redis.revocationBoundMs,
      )
    : undefined
  const identity = await IdentityService.open(
    store,
    config.server.adminToken,
    bus,
    config.redis.revocationBoundMs,
  )
  const ledger = new LedgerWriter(store, config.storage.flushIntervalMs, (err) =>
    log('error', 'ledger flush failed; will retry', { error: String(err) }),
  )
  ledger.start()
  const watchdog = new Watchdog()
  // Several nodes: money is admitted in Redis so the limits hold across nodes.
  const shared =
    config.redis.url && config.server.billing
      ? new SharedMeter(config.redis.url, config.redis.prefix, store, ledger)
      : undefined
  const meter: MoneyMeter = shared ?? new Meter(ledger, config.server.billing)
  identity.useMeter(meter)
  const pool = new NodePool(config.models)
  const deps: ChatDeps = {
    catalogue: new Catalogue(config.models),
    meter,
    limiter: new RateLimiter(),
    pool,
    policy: new LeastInFlight(),
    adapter: new OpenAICompatibleAdapter(watchdog),
    watchdog,
    timeouts: config.upstream,
    log,
  }
  const files = new FilesService(store, new LocalFileStore(config.files.dir), config.files)
  const secret = config.server.secret ?? (await store.initMeta('server_secret', randomBase62(43)))
  // Batches need a database file that worker threads can open too.
  const scheduler =
    config.storage.kind === 'sqlite' && config.storage.sqlitePath === ':memory:'
      ? undefined
      : new BatchScheduler(
          store,
          identity,
          deps.meter,
          ledger,
          pool,
          config,
          { ...config.batches, workerUrl },
          log,
        )
  scheduler?.start({
    storage: config.storage,
    filesDir: config.files.dir,
    models: config.models,
    firstByteTimeoutMs: config.upstream.firstByteTimeoutMs,
    leaseMs: Math.max(60_000, config.upstream.firstByteTimeoutMs * 2),
    concurrency: config.batches.concurrency,
    maxAttempts: config.batches.maxAttempts,
  })
  const batches = new BatchService(
    store,
    files,
    scheduler,
    new LinkSigner(secret),
    config.batches.windowSec,
    config.batches.linkTtlSec,
  )
  return {
    config,
    store,
    identity,
    deps,
    ledger,
    files,
    batches,
    log,
    async stop() {
      await scheduler?.stop()
      watchdog.stop()
      await ledger.stop()
      await bus?.close()
      shared?.close()
    },
  }
}

const ORDER: Record<LogLevel, number> = { debug: 0, info: 1, warn: 2, error: 3 }

/** JSON lines on stderr at or above `level`. */
export function consoleLog(level: LogLevel): Log {
  return (l, msg, fields) => {
    if (ORDER[l] < ORDER[level]) return
    process.stderr.write(`${JSON.stringify({ t: new Date().toISOString(), level: l, msg, ...fields })}\n`)
  }
}
