import { isAbsolute } from 'node:path'
import { BatchScheduler } from './batches/scheduler.ts'
import { BatchService, LinkSigner } from './batches/service.ts'
import { LocalConcurrency } from './billing/concurrency.ts'
import { LedgerWriter, storeSink } from './billing/ledger.ts'
import { ThreadLedgerSink } from './billing/ledger-sink.ts'
import { Meter, type MoneyMeter } from './billing/meter.ts'
import { LocalRateLimiter } from './billing/rate-limiter.ts'
import { Receipts } from './billing/receipt-keys.ts'
import { ReceiptSigner } from './billing/receipt-signer.ts'
import { SharedConcurrency } from './billing/shared-concurrency.ts'
import { SharedMeter } from './billing/shared-meter.ts'
import { SharedRateLimiter } from './billing/shared-rate-limiter.ts'
import { Catalogue } from './catalogue/catalogue.ts'
import { RedisBus } from './cluster/bus.ts'
import { PeerNodes } from './cluster/peer-nodes.ts'
import { type Config, ConfigError, loadConfig, type ModelConfig } from './config/load.ts'
import { InvalidConfig } from './errors.ts'
import { DiskWatch } from './files/disk.ts'
import { LocalFileStore } from './files/file-store.ts'
import { FilesService } from './files/service.ts'
import { IdentityService } from './identity/service.ts'
import { ConsoleSessions } from './identity/sessions.ts'
import { randomBase62 } from './ids.ts'
import type { Log } from './log.ts'
import { AccessLog } from './metrics/access-log.ts'
import { Telemetry } from './metrics/telemetry.ts'
import type { ChatDeps } from './pipeline/chat.ts'
import { WarmupCounts } from './pipeline/dispatch.ts'
import { OpenStreams } from './pipeline/drain.ts'
import { ShareBudget } from './routing/budget.ts'
import { NodePool, type NodeState } from './routing/nodes.ts'
import { LeastInFlight, type RoutingPolicy } from './routing/policy.ts'
import { PredictedTtft } from './routing/predicted.ts'
import { NodeProbes } from './routing/probes.ts'
import type { Store } from './storage/store.ts'
import type { Tracing } from './tracing/tracing.ts'
import { ProviderRegistry } from './upstream/providers/index.ts'
import { Watchdog } from './upstream/watchdog.ts'
import { VERSION } from './version.ts'
import { WebhookDelivery } from './webhooks/delivery.ts'
import { Webhooks } from './webhooks/service.ts'
import type { HubBus } from './workers/hub.ts'
import {
  IpcBus,
  PrimaryLedger,
  type PrimaryLink,
  RemoteConcurrency,
  RemoteMeter,
  RemoteRateLimiter,
} from './workers/worker.ts'

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
  /** Request metrics and the access log. */
  readonly telemetry: Telemetry
  /** Organizations' webhooks and the alerts they receive (docs/api.md, "Webhooks"). */
  readonly webhooks: Webhooks
  /** Web console sign-ins (routes under /console). */
  readonly consoleSessions: ConsoleSessions
  readonly log: Log
  /** Reads the config again for a reload (main.ts sets it with its flags); throws ConfigError. */
  loadConfig: () => Config
  /** One of several workers (main.ts sets it): /metrics answers with every process's series. */
  gatherMetrics?: () => Promise<string>
  /**
   * Reloads models, routes and prices (SIGHUP, POST /v1/admin/reload) with no request dropped:
   * requests admitted before keep their model's price; nodes that stay keep what was learned of
   * them, removed ones drain. An invalid file throws InvalidConfig and changes nothing.
   */
  reload(): ReloadReport
  /** Request traces over OTLP/HTTP; undefined when not configured (then nothing is traced). */
  readonly tracing: Tracing | undefined
  /** A graceful stop began: /ready answers 503 and responses close their connections. */
  draining: boolean
  /**
   * A graceful stop's first half (the HTTP server drains meanwhile): batches take no new work and
   * their running lines finish, until `untilMs`.
   */
  drain(untilMs: number): Promise<void>
  /** Flushes the ledger, gives back batch lines still leased, stops timers; the store is closed by whoever opened it. */
  stop(): Promise<void>
}

/** Entry points of the worker threads, as main.ts sees them (needed inside the executable). */
export interface ThreadEntries {
  readonly batchWorker?: string | URL
  readonly ledgerThread?: string | URL
  readonly receiptThread?: string | URL
}

/**
 * One of several processes serving one port (src/workers/, docs/workers.md): the primary holds the
 * money, rate limits, concurrency, ledger, batches and webhooks' delivery for all of them and
 * serves no HTTP; a worker serves HTTP and asks the primary for those. Absent: a process alone.
 */
export type ProcessRole =
  | { readonly kind: 'primary'; readonly bus: HubBus }
  | { readonly kind: 'worker'; readonly link: PrimaryLink; readonly index: number }
  /** A worker on PostgreSQL and Redis: a node of the cluster like any other. */
  | { readonly kind: 'node'; readonly index: number }

/** For tests only, never set in production: main.ts sets `clock` from TROPA_TEST_CLOCK_OFFSET_MS. */
export interface TestHooks {
  /**
   * Unix ms now for period budgets (which period a request is admitted in, when it resets), so
   * a test crosses a period's boundary without waiting for one. Default Date.now.
   */
  readonly clock?: () => number
}

export async function buildServices(
  config: Config,
  store: Store,
  log: Log,
  threads: ThreadEntries = {},
  /** A routing policy instead of the configured one (the HTTP routing benchmark runs peers' policies). */
  policyOverride?: RoutingPolicy,
  /** For tests only: what stands in for the world (see TestHooks). */
  hooks: TestHooks = {},
  /** Several processes on one port (docs/workers.md); absent: one process. */
  role?: ProcessRole,
): Promise<Services> {
  const link = role?.kind === 'worker' ? role.link : undefined
  // The OpenTelemetry SDK is loaded only when tracing is configured.
  const tracing = config.tracing
    ? new (await import('./tracing/tracing.ts')).Tracing(config.tracing, VERSION)
    : undefined
  const watchdog = new Watchdog()
  const providers = new ProviderRegistry(watchdog)
  const unsupported = (models: readonly ModelConfig[]) =>
    models.flatMap((m) =>
      m.routes
        .filter((r) => !providers.supports(r.provider))
        .map(
          (r) => `${m.id}: route ${r.node} names provider ${r.provider}, which this build has no adapter for`,
        ),
    )
  const missing = unsupported(config.models)
  if (missing.length > 0) throw new ConfigError(missing)
  const workerUrl = threads.batchWorker
  const bus =
    role?.kind === 'primary'
      ? role.bus
      : role?.kind === 'worker'
        ? new IpcBus(role.link, `worker-${role.index}`)
        : config.redis.url
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
  if (role?.kind === 'primary') identity.balancesHere = true
  if (link) identity.useCreditor((org, amountNano, reason) => link.call('credit', org.id, amountNano, reason))
  // The embedded file is written from a thread of its own, so SQLite's checkpoints never stall
  // the event loop; PostgreSQL is written over the network from here.
  const sqliteFile = config.storage.kind === 'sqlite' && config.storage.sqlitePath !== ':memory:'
  const sink = link
    ? storeSink(store)
    : sqliteFile
      ? new ThreadLedgerSink(
          config.storage.sqlitePath,
          threads.ledgerThread ?? new URL('./billing/ledger-thread.ts', import.meta.url),
        )
      : storeSink(store)
  // A worker's settlements are written by the primary.
  const ledger = link
    ? new PrimaryLedger(link)
    : new LedgerWriter(
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
          ...(hooks.clock && { clock: hooks.clock }),
        })
      : undefined
  const meter: MoneyMeter =
    shared ??
    (link && config.server.billing ? new RemoteMeter(link, hooks.clock) : undefined) ??
    new Meter(ledger, config.server.billing, {
      ...(hooks.clock && { clock: hooks.clock }),
      // A budget counter this node does not hold is read back from the ledger.
      periodSpend: (key, endUser, span) =>
        store.periodSpend({
          orgId: key.orgId,
          keyId: key.id,
          endUser,
          fromMs: span.startMs,
          toMs: span.endMs,
        }),
    })
  // Rate limits are counted in Redis too when there is one, so they hold across nodes.
  const sharedLimiter = link
    ? new RemoteRateLimiter(link)
    : config.redis.url
      ? new SharedRateLimiter(config.redis.url, config.redis.prefix)
      : undefined
  // And keys' max_concurrency: a dead node's slots stop counting after the same lease as its holds.
  const sharedConcurrency = link
    ? new RemoteConcurrency(link)
    : config.redis.url
      ? new SharedConcurrency(config.redis.url, config.redis.prefix, {
          leaseMs: config.redis.reservationLeaseMs,
          log,
        })
      : undefined
  identity.useMeter(meter)
  // Alerts: told of settled charges only for organizations that have a webhook for them.
  const webhooks = await Webhooks.open(store, config.webhooks.allowPrivateUrls, log)
  meter.watch = webhooks
  const delivery = new WebhookDelivery(
    store,
    {
      ...config.webhooks,
      soleOwner: config.storage.kind === 'sqlite',
      // Another node (or worker) may have changed the webhooks: read them again before each poll.
      ...((config.storage.kind === 'postgres' || role?.kind === 'primary') && {
        beforePoll: () => webhooks.refresh(),
      }),
      userAgent: `Tropa/${VERSION} (webhooks)`,
    },
    log,
  )
  // A worker leaves delivery to its primary.
  if (!link) delivery.start()
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
  const { accessLog: access } = config
  const accessLog =
    access.sink === 'off'
      ? undefined
      : new AccessLog(
          {
            ...access,
            sink: access.sink,
            // Each worker its own file (access.log → access.worker-0.log): one writer rotates each.
            ...((role?.kind === 'worker' || role?.kind === 'node') && {
              path: workerPath(access.path, role.index),
            }),
          },
          (err) =>
            log('error', 'writing the access log failed; its lines were dropped', { error: String(err) }),
        )
  const telemetry = new Telemetry(
    config.metrics,
    accessLog,
    policyOverride?.name ?? config.routing.policy,
    config.accessLog,
  )
  const secret = config.server.secret ?? (await store.initMeta('server_secret', randomBase62(43)))
  // Receipts: signed in a thread of their own (billing/receipt-signer.ts); none when nothing is billed.
  const receipts =
    config.receipts.enabled && config.server.billing
      ? await Receipts.open(
          config.receipts.responses,
          store,
          secret,
          new ReceiptSigner(
            threads.receiptThread ?? new URL('./billing/receipt-thread.ts', import.meta.url),
            (err) =>
              log('error', 'signing receipts failed; answers went without them', { error: err.message }),
          ),
          log,
          bus && (() => bus.publishAndConfirm({ t: 'receipt-keys', id: '', from: bus.nodeId }, 2000)),
        )
      : undefined
  // Another node rotated: read the keys, then acknowledge (its rotation answers once every node has them).
  if (receipts && bus) bus.on('receipt-keys', () => receipts.reload().catch(() => {}))
  const deps: ChatDeps = {
    catalogue: new Catalogue(config.models),
    meter,
    limiter: sharedLimiter ?? new LocalRateLimiter(),
    concurrency: sharedConcurrency ?? new LocalConcurrency(),
    pool,
    policy,
    adapter: providers,
    watchdog,
    timeouts: config.upstream,
    streamWriteTimeoutMs: config.server.streamWriteTimeoutMs,
    sseKeepAliveMs: config.server.sseKeepAliveMs,
    streams: new OpenStreams(),
    hedges: config.routing.hedgeShare > 0 ? new ShareBudget(config.routing.hedgeShare, 10) : undefined,
    retries: new ShareBudget(config.routing.retryShare, 10),
    warmups: new WarmupCounts(),
    log,
    telemetry,
    receipts,
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
    link
      ? () => {}
      : () =>
          void files
            .sweep(config.files.orphanGraceSec * 1000)
            .then((n) => n > 0 && log('info', 'removed orphaned upload files', { count: n }))
            .catch((err) => log('error', 'sweeping orphaned upload files failed', { error: String(err) })),
    0,
  )
  // Batches need a database file that worker threads can open too.
  // A worker leaves batches to its primary (they are nudged by the primary's tick).
  const scheduler =
    link || (config.storage.kind === 'sqlite' && config.storage.sqlitePath === ':memory:')
      ? undefined
      : new BatchScheduler(
          store,
          identity,
          deps.meter,
          ledger,
          pool,
          config,
          {
            ...config.batches,
            workerUrl,
            reportDiskFull: (err) => disk.report(err),
            finished: (b) => webhooks.batchFinished(b),
            tracing,
            receiptKid: receipts && (() => receipts.kid),
          },
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
  // A cluster's nodes each run batches and serve interactive requests: each tells the others of
  // its requests on the upstreams while a batch wants nodes, so lines yield to all of them.
  const peers =
    bus instanceof RedisBus && scheduler
      ? new PeerNodes(pool, bus.nodeId, () => scheduler.wantsNodes, bus.channelOf('nodes'))
      : undefined
  const batches = new BatchService(
    store,
    files,
    scheduler,
    new LinkSigner(secret),
    config.batches.windowSec,
    config.batches.linkTtlSec,
  )
  const svc: Services = {
    config,
    store,
    identity,
    deps,
    ledger,
    files,
    batches,
    telemetry,
    webhooks,
    consoleSessions: new ConsoleSessions(store, identity, config.console.sessionIdleSec),
    log,
    tracing,
    loadConfig: () => {
      if (!isAbsolute(config.source))
        throw new ConfigError(['Tropa was started without a config file: there is nothing to reload'])
      return loadConfig({ configPath: config.source })
    },
    reload() {
      let next: Config
      try {
        next = svc.loadConfig()
        const missing = unsupported(next.models)
        if (missing.length > 0) throw new ConfigError(missing)
      } catch (err) {
        const problems = err instanceof ConfigError ? err.problems : [String(err)]
        log('error', 'config reload refused; the running config stays', { problems })
        throw new InvalidConfig(problems)
      }
      const report = reloadReport(config, deps.catalogue.all(), next)
      const { added, removed } = pool.replace(next.models)
      deps.catalogue.replace(next.models)
      probes.retarget(pool, next.models)
      scheduler?.useModels(next.models)
      for (const node of removed) forgetWhenIdle(node)
      const done = { ...report, nodes_added: added, nodes_removed: removed.map((n) => n.name) }
      log('info', 'config reloaded', done)
      return done
    },
    draining: false,
    async drain(untilMs) {
      svc.draining = true
      await scheduler?.drain(untilMs)
    },
    async stop() {
      clearTimeout(sweep)
      disk.stop()
      peers?.stop()
      await scheduler?.stop()
      await delivery.stop()
      await webhooks.settled()
      probes.stop()
      watchdog.stop()
      await ledger.stop()
      receipts?.stop()
      await bus?.close()
      shared?.close()
      sharedLimiter?.close()
      sharedConcurrency?.close()
      await accessLog?.stop()
      await tracing
        ?.shutdown()
        .catch((err) => log('warn', 'sending the last traces failed', { error: String(err) }))
    },
  }
  /** What a policy learned of a removed node is dropped once its last request ended. */
  const forgetWhenIdle = (node: NodeState) => {
    if (node.inFlight <= 0) return policy.forget?.(node)
    setTimeout(() => forgetWhenIdle(node), 1000).unref?.()
  }
  return svc
}

/** A worker's own file beside the configured one: `access.log` → `access.worker-3.log`. */
export function workerPath(path: string, index: number): string {
  const slash = path.lastIndexOf('/')
  const dot = path.lastIndexOf('.')
  return dot > slash + 1
    ? `${path.slice(0, dot)}.worker-${index}${path.slice(dot)}`
    : `${path}.worker-${index}`
}

/** What a reload changed, as the log and POST /v1/admin/reload show it. */
export interface ReloadReport {
  readonly models: readonly string[]
  readonly models_added: readonly string[]
  readonly models_removed: readonly string[]
  /** Models whose price, routes or limits changed. */
  readonly models_changed: readonly string[]
  readonly nodes_added: readonly string[]
  readonly nodes_removed: readonly string[]
  /** Changed sections a reload does not apply (they need a restart). */
  readonly restart_needed: readonly string[]
}

/** Sections of the config a reload leaves as they are. */
const RESTART_SECTIONS = [
  'server',
  'upstream',
  'routing',
  'storage',
  'redis',
  'batches',
  'files',
  'responses',
  'webhooks',
  'receipts',
] as const

function reloadReport(
  running: Config,
  before: readonly ModelConfig[],
  next: Config,
): Omit<ReloadReport, 'nodes_added' | 'nodes_removed'> {
  const old = new Map(before.map((m) => [m.id, m]))
  const ids = new Set(next.models.map((m) => m.id))
  // bigint prices: JSON.stringify cannot write them, so they are compared as text.
  const text = (m: ModelConfig) => JSON.stringify(m, (_, v) => (typeof v === 'bigint' ? v.toString() : v))
  return {
    models: next.models.map((m) => m.id),
    models_added: next.models.filter((m) => !old.has(m.id)).map((m) => m.id),
    models_removed: before.filter((m) => !ids.has(m.id)).map((m) => m.id),
    models_changed: next.models
      .filter((m) => old.has(m.id) && text(old.get(m.id)!) !== text(m))
      .map((m) => m.id),
    restart_needed: RESTART_SECTIONS.filter(
      (k) => JSON.stringify(comparable(running[k])) !== JSON.stringify(comparable(next[k])),
    ),
  }
}

/** A section as compared for restart_needed (values main.ts fills in at start left out). */
function comparable(section: unknown): unknown {
  if (!section || typeof section !== 'object') return section
  const { adminToken: _a, port: _p, ...rest } = section as Record<string, unknown>
  return JSON.parse(JSON.stringify(rest, (_, v) => (typeof v === 'bigint' ? v.toString() : v)))
}
