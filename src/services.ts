import { BatchScheduler } from './batches/scheduler.ts'
import { BatchService, LinkSigner } from './batches/service.ts'
import { LedgerWriter, storeSink } from './billing/ledger.ts'
import { ThreadLedgerSink } from './billing/ledger-sink.ts'
import { Meter, type MoneyMeter } from './billing/meter.ts'
import { LocalRateLimiter } from './billing/rate-limiter.ts'
import { SharedMeter } from './billing/shared-meter.ts'
import { SharedRateLimiter } from './billing/shared-rate-limiter.ts'
import { Catalogue } from './catalogue/catalogue.ts'
import { RedisBus } from './cluster/bus.ts'
import { type Config, ConfigError } from './config/load.ts'
import { DiskWatch } from './files/disk.ts'
import { LocalFileStore } from './files/file-store.ts'
import { FilesService } from './files/service.ts'
import { IdentityService } from './identity/service.ts'
import { ConsoleSessions } from './identity/sessions.ts'
import { randomBase62 } from './ids.ts'
import type { Log } from './log.ts'
import type { ChatDeps } from './pipeline/chat.ts'
import { ShareBudget } from './routing/budget.ts'
import { NodePool } from './routing/nodes.ts'
import { LeastInFlight, type RoutingPolicy } from './routing/policy.ts'
import { PredictedTtft } from './routing/predicted.ts'
import { NodeProbes } from './routing/probes.ts'
import type { Store } from './storage/store.ts'
import { ProviderRegistry } from './upstream/providers/index.ts'
import { Watchdog } from './upstream/watchdog.ts'

export { consoleLog, type Log, type LogLevel } from './log.ts'

/** Everything the HTTP layer calls, built once by main.ts (or a test) from a config and a store. */
export interface Services {
  readonly config: Config
  readonly store: Store
  readonly identity: IdentityService
  readonly deps: ChatDeps
  readonly ledger: LedgerWriter
  readonly files: FilesService
  readonly batches: BatchService
  /** Web console sign-ins (routes under /console). */
  readonly consoleSessions: ConsoleSessions
  readonly log: Log
  /** Flushes the ledger and stops timers; the store is closed by whoever opened it. */
  stop(): Promise<void>
}

/** Entry points of the worker threads, as main.ts sees them (needed inside the executable). */
export interface ThreadEntries {
  readonly batchWorker?: string | URL
  readonly ledgerThread?: string | URL
}

export async function buildServices(
  config: Config,
  store: Store,
  log: Log,
  threads: ThreadEntries = {},
  /** A routing policy instead of the configured one (the HTTP routing benchmark runs peers' policies). */
  policyOverride?: RoutingPolicy,
): Promise<Services> {
  const watchdog = new Watchdog()
  const providers = new ProviderRegistry(watchdog)
  const missing = config.models.flatMap((m) =>
    m.routes
      .filter((r) => !providers.supports(r.provider))
      .map(
        (r) => `${m.id}: route ${r.node} names provider ${r.provider}, which this build has no adapter for`,
      ),
  )
  if (missing.length > 0) throw new ConfigError(missing)
  const workerUrl = threads.batchWorker
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
  // The embedded file is written from a thread of its own, so SQLite's checkpoints never stall
  // the event loop; PostgreSQL is written over the network from here.
  const sqliteFile = config.storage.kind === 'sqlite' && config.storage.sqlitePath !== ':memory:'
  const sink = sqliteFile
    ? new ThreadLedgerSink(
        config.storage.sqlitePath,
        threads.ledgerThread ?? new URL('./billing/ledger-thread.ts', import.meta.url),
      )
    : storeSink(store)
  const ledger = new LedgerWriter(
    sink,
    config.storage.flushIntervalMs,
    (err) => log('error', 'ledger flush failed; will retry', { error: String(err) }),
    config.storage.ledgerQueueMax,
  )
  ledger.start()
  // Several nodes: money is admitted in Redis so the limits hold across nodes.
  const shared =
    config.redis.url && config.server.billing
      ? new SharedMeter(config.redis.url, config.redis.prefix, store, ledger, {
          leaseMs: config.redis.reservationLeaseMs,
          flushIntervalMs: config.storage.flushIntervalMs,
          log,
        })
      : undefined
  const meter: MoneyMeter = shared ?? new Meter(ledger, config.server.billing)
  // Rate limits are counted in Redis too when there is one, so they hold across nodes.
  const sharedLimiter = config.redis.url
    ? new SharedRateLimiter(config.redis.url, config.redis.prefix)
    : undefined
  identity.useMeter(meter)
  const pool = new NodePool(config.models)
  const policy: RoutingPolicy =
    policyOverride ??
    (config.routing.policy === 'least-in-flight'
      ? new LeastInFlight()
      : new PredictedTtft({ rng: Math.random, indexBlocks: config.routing.prefixIndexBlocks }))
  const probes = new NodeProbes(pool, policy, config.models, {
    healthCheckMs: config.routing.healthCheckMs,
    metricsPollMs: config.routing.metricsPollMs,
    timeoutMs: config.upstream.connectTimeoutMs,
    log,
  })
  probes.start()
  const deps: ChatDeps = {
    catalogue: new Catalogue(config.models),
    meter,
    limiter: sharedLimiter ?? new LocalRateLimiter(),
    pool,
    policy,
    adapter: providers,
    watchdog,
    timeouts: config.upstream,
    streamWriteTimeoutMs: config.server.streamWriteTimeoutMs,
    hedges: config.routing.hedgeShare > 0 ? new ShareBudget(config.routing.hedgeShare, 10) : undefined,
    retries: new ShareBudget(config.routing.retryShare, 10),
    log,
  }
  const contents = new LocalFileStore(config.files.dir)
  const disk = new DiskWatch(
    () => contents.probe(),
    (full, detail) =>
      full
        ? log('error', 'the disk is full: uploads and result files get 507 until space is freed', {
            dir: config.files.dir,
            error: detail,
          })
        : log('info', 'the disk has room again', { dir: config.files.dir }),
  )
  const files = new FilesService(store, contents, config.files, disk)
  // What failed uploads and crashes left behind. In the background: the router answers meanwhile.
  const sweep = setTimeout(
    () =>
      void files
        .sweep(config.files.orphanGraceSec * 1000)
        .then((n) => n > 0 && log('info', 'removed orphaned upload files', { count: n }))
        .catch((err) => log('error', 'sweeping orphaned upload files failed', { error: String(err) })),
    0,
  )
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
          { ...config.batches, workerUrl, reportDiskFull: (err) => disk.report(err) },
          log,
        )
  scheduler?.start({
    storage: config.storage,
    filesDir: config.files.dir,
    models: config.models,
    firstByteTimeoutMs: config.upstream.firstByteTimeoutMs,
    idleTimeoutMs: config.upstream.idleTimeoutMs,
    // A lease outlives the longest a line may take (headers, then the body), with room to spare.
    leaseMs:
      config.batches.leaseMs ??
      Math.max(60_000, config.upstream.firstByteTimeoutMs + config.upstream.idleTimeoutMs + 10_000),
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
    consoleSessions: new ConsoleSessions(store, identity, config.console.sessionIdleSec),
    log,
    async stop() {
      clearTimeout(sweep)
      disk.stop()
      await scheduler?.stop()
      probes.stop()
      watchdog.stop()
      await ledger.stop()
      await bus?.close()
      shared?.close()
      sharedLimiter?.close()
    },
  }
}
