import { existsSync, readFileSync } from 'node:fs'
import { availableParallelism } from 'node:os'
import { resolve } from 'node:path'
import { Value, ValueErrorType } from '@sinclair/typebox/value'
import { type NanoRub, parseRub, perMillionToPerTokenNano } from '../billing/money.ts'
import {
  type ConfigFile,
  ConfigFileSchema,
  type ModelFile,
  type ProviderKind,
  TRACE_SAMPLERS,
} from './schema.ts'

/**
 * batches.fill_load (on: without it a fleet that never goes quiet runs a batch at 3-7% of its
 * rate; with it the bursts' valleys read 0.74-0.81 of the idle rate, the runs' interactive
 * figures 0.99-1.17x, and the valleys' own requests TTFT p50 2.5x, about the peaks') and
 * batches.quiet_load by default: docs/batches.md has why, and
 * bench/batch-yield.ts the fleet's interactive load at each of its loads (0.30-0.35 at 50%, 0.55-0.60
 * at 80%, 0.06-0.08 in the bursts' valleys): at 0.25, packing took a node now and then at 50% and
 * no line finished there before it was given back.
 */
const FILL_LOAD = 0.1
const QUIET_LOAD = 0.15
/**
 * batches.pack_share by default (docs/batches.md, "Packing"): off. Packing fills valleys (0.52-0.62
 * of the idle rate, against 0.39 without) but the valley's own interactive requests pay for it
 * (p99 up 25-65%), and a light interactive load beside a batch read TTFT p50 up to 1.4x
 * (test/batches/priority.test.ts): interactive traffic first, so it is asked for, not given.
 */
const PACK_SHARE = 0

export interface RouteConfig {
  /** Stable node name (defaults to host:port of the base URL); routing state is kept per node. */
  readonly node: string
  /** The protocol the upstream speaks; its adapter is src/upstream/providers/<provider>/. */
  readonly provider: ProviderKind
  readonly baseUrl: string
  readonly upstreamModel: string
  readonly apiKey: string | undefined
  readonly maxConcurrency: number
  readonly weight: number
  /** Overrides upstream.firstByteTimeoutMs for this route. */
  readonly firstByteTimeoutMs: number | undefined
  /** Whether a late first token may be hedged to another node. */
  readonly hedge: boolean
  /** The node runs vLLM's priority scheduling: batch lines are sent with the lowest priority. */
  readonly priorityScheduling: boolean
  /**
   * A spread new session's new node may be warmed with its first prompt (`routing/predicted.ts`
   * `takeWarmup`): true, false, or undefined for "when the node reports Prometheus metrics".
   */
  readonly warmSessions: boolean | undefined
  /** The node's Prometheus metrics, if it has them. */
  readonly metricsUrl: string
  /** Extra static headers of every request. */
  readonly headers: Readonly<Record<string, string>>
  /** CA certificates (PEM) to trust, from tls_ca_file. */
  readonly tlsCa: string | undefined
  /** Provider options: azure's api_version, gigachat's auth_url and scope, yandex's folder_id. */
  readonly apiVersion: string | undefined
  readonly authUrl: string | undefined
  readonly scope: string | undefined
  readonly folderId: string | undefined
}
/** What a route has when the config says nothing of its provider: OpenAI-compatible, no extras. */
export const OPENAI_ROUTE = {
  provider: 'openai',
  headers: {},
  tlsCa: undefined,
  apiVersion: undefined,
  authUrl: undefined,
  scope: undefined,
  folderId: undefined,
} as const satisfies Partial<RouteConfig>

export interface Price {
  readonly promptNano: NanoRub
  readonly completionNano: NanoRub
  /** Prompt tokens the upstream reports as cached; at most promptNano (the reservation's worst case). */
  readonly cachedPromptNano: NanoRub
}
export interface ModelConfig {
  readonly id: string
  readonly ownedBy: string
  readonly kind: 'chat' | 'embedding'
  readonly contextLength: number
  /** The most tokens one answer may have; undefined: what the context leaves. */
  readonly maxOutputTokens?: number | undefined
  readonly dimensions: number | undefined
  readonly created: number
  readonly price: Price
  readonly routes: readonly RouteConfig[]
  /** Models tried in order when every node of this one failed (chat). */
  readonly fallbacks: readonly string[]
}
export interface Config {
  readonly source: string
  readonly server: {
    readonly host: string
    readonly port: number
    readonly dataDir: string
    readonly adminToken: string | undefined
    readonly maxBodyBytes: number
    /** Request headers (names and values) above this many bytes get a 431 with an error body. */
    readonly maxHeaderBytes: number
    /** A stream whose client takes no bytes for this long is cut. */
    readonly streamWriteTimeoutMs: number
    /** A stream still without its first token this long after it began is sent its headers and SSE comments; 0: off. */
    readonly sseKeepAliveMs: number
    /** On SIGTERM, how long in-flight requests and streams may take to finish. */
    readonly shutdownGraceMs: number
    /**
     * Processes serving the port (docs/workers.md): the number of cores by default; 1 with --demo
     * or an in-memory store, which several processes cannot share.
     */
    readonly workers: number
    readonly logLevel: 'debug' | 'info' | 'warn' | 'error'
    readonly billing: boolean
    readonly secret: string | undefined
    /** The base of links Tropa hands out, without a trailing slash; undefined: the listen address. */
    readonly publicUrl: string | undefined
  }
  readonly upstream: {
    readonly connectTimeoutMs: number
    readonly firstByteTimeoutMs: number
    readonly idleTimeoutMs: number
    readonly maxAttempts: number
  }
  readonly routing: {
    readonly policy: 'predicted-ttft' | 'least-in-flight'
    readonly hedgeShare: number
    readonly retryShare: number
    readonly metricsPollMs: number
    readonly healthCheckMs: number
    readonly prefixIndexBlocks: number
    readonly sessionHeader: string
  }
  readonly storage: {
    readonly kind: 'sqlite' | 'postgres'
    readonly sqlitePath: string
    readonly sqliteStartupCheck: 'quick' | 'full' | 'off'
    readonly postgresUrl: string | undefined
    readonly postgresMaxConnections: number
    readonly statementTimeoutMs: number
    readonly flushIntervalMs: number
    readonly ledgerQueueMax: number
  }
  readonly demo: { readonly enabled: boolean; readonly nodes: number; readonly balanceNano: NanoRub }
  readonly files: {
    readonly dir: string
    readonly maxBytes: number
    readonly maxLines: number
    readonly orphanGraceSec: number
    readonly minFreeBytes: number
  }
  readonly console: {
    readonly enabled: boolean
    readonly sessionIdleSec: number
  }
  readonly receipts: {
    /** Signing keys, the published key set, each ledger row's key, receipts in JSONL exports. */
    readonly enabled: boolean
    /** Every billed response carries its receipt (x-tropa-receipt, usage.receipt). */
    readonly responses: boolean
  }
  readonly responses: {
    /** 0: stored responses are kept until deleted. */
    readonly retentionSec: number
    readonly maxStoredBytes: number
  }
  readonly webhooks: {
    readonly pollMs: number
    readonly timeoutMs: number
    readonly retryBaseMs: number
    readonly retryMaxMs: number
    readonly giveUpAfterMs: number
    readonly concurrency: number
    readonly allowPrivateUrls: boolean
  }
  readonly redis: {
    readonly url: string | undefined
    readonly prefix: string
    readonly revocationBoundMs: number
    readonly reservationLeaseMs: number
  }
  readonly batches: {
    readonly workers: number
    readonly concurrency: number
    readonly windowSec: number
    readonly interactiveReserve: number
    readonly reserveSlots: number
    readonly busyShare: number
    readonly quietMs: number
    readonly fillLoad: number
    readonly quietLoad: number
    readonly packShare: number
    readonly tickMs: number
    readonly linkTtlSec: number
    readonly maxAttempts: number
    readonly leaseMs: number | undefined
  }
  readonly metrics: {
    readonly requests: boolean
    readonly perOrg: boolean
    readonly perOrgMax: number
  }
  readonly accessLog: {
    readonly sink: 'off' | 'stderr' | 'file'
    /** Absolute. */
    readonly path: string
    readonly maxBytes: number
    readonly keep: number
    readonly bufferLines: number
    readonly bufferBytes: number
    readonly captureOrgs: readonly string[]
    readonly captureKeys: readonly string[]
    readonly captureMaxChars: number
  }
  /** Request traces over OTLP/HTTP; undefined: off (no span is ever made). */
  readonly tracing:
    | {
        /** The OTLP/HTTP traces URL. */
        readonly endpoint: string
        readonly serviceName: string
        readonly sampler: string
        readonly samplerArg: number
      }
    | undefined
  readonly models: readonly ModelConfig[]
}

/** Every problem found in a config, each naming where it is and how to fix it. */
export class ConfigError extends Error {
  constructor(readonly problems: readonly string[]) {
    super(`invalid configuration:\n  - ${problems.join('\n  - ')}`)
  }
}

/** Command-line values that override the file and the environment. */
export interface ConfigOverrides {
  configPath?: string | undefined
  port?: number | undefined
  host?: string | undefined
  dataDir?: string | undefined
  demo?: boolean | undefined
}

type Env = Record<string, string | undefined>

/** Environment variables that override file keys (documented in docs/config.md). */
const ENV_KEYS: Record<
  string,
  readonly [
    section: 'server' | 'storage' | 'demo' | 'redis' | 'access_log' | 'receipts',
    key: string,
    kind: 'int' | 'str' | 'bool',
  ]
> = {
  TROPA_PORT: ['server', 'port', 'int'],
  TROPA_HOST: ['server', 'host', 'str'],
  TROPA_WORKERS: ['server', 'workers', 'int'],
  TROPA_DATA_DIR: ['server', 'data_dir', 'str'],
  TROPA_ADMIN_TOKEN: ['server', 'admin_token', 'str'],
  TROPA_LOG_LEVEL: ['server', 'log_level', 'str'],
  TROPA_MAX_BODY_BYTES: ['server', 'max_body_bytes', 'int'],
  TROPA_PUBLIC_URL: ['server', 'public_url', 'str'],
  TROPA_SQLITE_PATH: ['storage', 'sqlite_path', 'str'],
  TROPA_STORAGE: ['storage', 'kind', 'str'],
  TROPA_POSTGRES_URL: ['storage', 'postgres_url', 'str'],
  TROPA_REDIS_URL: ['redis', 'url', 'str'],
  TROPA_REDIS_PREFIX: ['redis', 'prefix', 'str'],
  TROPA_DEMO: ['demo', 'enabled', 'bool'],
  TROPA_ACCESS_LOG: ['access_log', 'sink', 'str'],
  TROPA_RECEIPTS: ['receipts', 'enabled', 'bool'],
  TROPA_RECEIPTS_RESPONSES: ['receipts', 'responses', 'bool'],
}
/** Benchmarks compare the money path on and off in one run; this turns it off. */
const NO_BILLING_ENV = 'TROPA_BENCH_NO_BILLING'
/** Tests only: main.ts runs period budgets on a clock this far ahead of the real one (docs/billing.md). */
export const TEST_CLOCK_ENV = 'TROPA_TEST_CLOCK_OFFSET_MS'
/** `fetch`: streamed upstream calls go through fetch, not upstream/h1.ts (docs/providers.md). */
const STREAM_CLIENT_ENV = 'TROPA_STREAM_CLIENT'
// TROPA_WORKER and TROPA_WORKER_PORT: set by a primary for its workers (src/workers/protocol.ts).
const KNOWN_ENV = new Set([
  STREAM_CLIENT_ENV,
  ...Object.keys(ENV_KEYS),
  'TROPA_CONFIG',
  NO_BILLING_ENV,
  TEST_CLOCK_ENV,
  'TROPA_WORKER',
  'TROPA_WORKER_PORT',
])

/** Reads the file (TOML or JSON), applies env and flags, checks everything, returns a frozen Config. */
export function loadConfig(overrides: ConfigOverrides = {}, env: Env = process.env): Config {
  const path = overrides.configPath ?? env.TROPA_CONFIG
  const problems: string[] = []
  let file: Record<string, unknown> = {}
  let source = '(no config file)'
  if (path) {
    source = resolve(path)
    if (!existsSync(source))
      throw new ConfigError([`${source}: file not found. Fix: pass an existing file with --config`])
    try {
      const text = readFileSync(source, 'utf8')
      file = (source.endsWith('.json') ? JSON.parse(text) : Bun.TOML.parse(text)) as Record<string, unknown>
    } catch (err) {
      throw new ConfigError([`${source}: cannot parse: ${(err as Error).message}`])
    }
  }
  for (const name of Object.keys(env)) {
    if (name.startsWith('TROPA_') && !KNOWN_ENV.has(name) && !name.startsWith('TROPA_SIM_'))
      problems.push(
        `environment: ${name} is not a Tropa setting. Fix: unset it (known: ${[...KNOWN_ENV].join(', ')})`,
      )
  }
  const streamClient = env[STREAM_CLIENT_ENV]
  if (streamClient !== undefined && streamClient !== '' && streamClient !== 'fetch' && streamClient !== 'own')
    problems.push(
      `environment: ${STREAM_CLIENT_ENV}=${streamClient} is neither "fetch" nor "own". Fix: set it to fetch (streams through fetch) or unset it`,
    )
  for (const [name, [section, key, kind]] of Object.entries(ENV_KEYS)) {
    const raw = env[name]
    if (raw === undefined || raw === '') continue
    const sec = sectionOf(file, section)
    if (kind === 'int') {
      const n = Number(raw)
      if (!Number.isInteger(n)) problems.push(`environment: ${name}=${raw} is not an integer`)
      sec[key] = n
    } else if (kind === 'bool') sec[key] = raw === '1' || raw === 'true'
    else sec[key] = raw
  }
  const server = sectionOf(file, 'server')
  if (env[NO_BILLING_ENV] === '1' || env[NO_BILLING_ENV] === 'true') server.billing = false
  if (overrides.port !== undefined) server.port = overrides.port
  if (overrides.host !== undefined) server.host = overrides.host
  if (overrides.dataDir !== undefined) server.data_dir = overrides.dataDir
  if (overrides.demo) sectionOf(file, 'demo').enabled = true

  for (const e of Value.Errors(ConfigFileSchema, file)) {
    const where = e.path.slice(1).replaceAll('/', '.') || '(top level)'
    const hint =
      e.type === ValueErrorType.ObjectAdditionalProperties
        ? 'remove the unknown key (see docs/config.md for the keys)'
        : 'see docs/config.md'
    problems.push(`${source}: ${where}: ${e.message}. Fix: ${hint}`)
  }
  if (problems.length > 0) throw new ConfigError(problems)
  const cfg = file as ConfigFile
  const demoEnabled = cfg.demo?.enabled ?? false
  const models = (cfg.models ?? []).map((m, i) =>
    checkModel(m, `${source}: models[${i}] (${m.id})`, env, problems),
  )
  const ids = new Set<string>()
  for (const m of models) {
    if (ids.has(m.id))
      problems.push(`${source}: model ${m.id} is listed twice. Fix: give each model one entry`)
    ids.add(m.id)
  }
  const byId = new Map(models.map((m) => [m.id, m]))
  for (const m of models)
    for (const f of m.fallbacks) {
      const target = byId.get(f)
      if (!target || target.kind !== m.kind || f === m.id)
        problems.push(
          `${source}: model ${m.id} names ${f} as a fallback, which is ${!target ? 'not a configured model' : f === m.id ? 'itself' : `a model of another kind (${target.kind})`}. Fix: name other ${m.kind} models of this config`,
        )
    }
  if (models.length === 0 && !demoEnabled)
    problems.push(`${source}: no models configured. Fix: add [[models]] entries, or start with --demo`)
  if (cfg.redis?.url && cfg.storage?.kind !== 'postgres')
    problems.push(
      `${source}: redis.url is set but storage.kind is not "postgres". Fix: nodes that share Redis must share PostgreSQL too`,
    )
  if (cfg.storage?.kind === 'postgres' && !cfg.storage.postgres_url)
    problems.push(
      `${source}: storage.kind is "postgres" but storage.postgres_url is not set. Fix: set it (or TROPA_POSTGRES_URL)`,
    )
  const publicUrl = cfg.server?.public_url === undefined ? undefined : checkPublicUrl(cfg.server.public_url)
  if (publicUrl === null)
    problems.push(
      `${source}: server.public_url must be an http(s) URL without query or fragment, such as https://tropa.example.com. Fix: set it (or TROPA_PUBLIC_URL) to the address clients reach Tropa at`,
    )
  const balance = parseRub(cfg.demo?.balance_rub ?? '1000', 6)
  if (balance === undefined)
    problems.push(`${source}: demo.balance_rub must have at most six fractional digits`)
  const capturing =
    (cfg.access_log?.capture_orgs?.length ?? 0) + (cfg.access_log?.capture_keys?.length ?? 0) > 0
  if (capturing && (cfg.access_log?.sink ?? 'off') === 'off')
    problems.push(
      `${source}: access_log.capture_orgs / capture_keys name whose bodies to write into the access log, which is off. Fix: set access_log.sink to "stderr" or "file", or remove them`,
    )
  const tracing = tracingOf(cfg, env, problems)
  if ((cfg.server?.workers ?? 1) > 1) {
    if ((cfg.storage?.kind ?? 'sqlite') === 'sqlite' && cfg.storage?.sqlite_path === ':memory:')
      problems.push(
        `${source}: server.workers is ${cfg.server?.workers}, but an in-memory store cannot be shared by several processes. Fix: set server.workers to 1, or store in a file`,
      )
    if (demoEnabled)
      problems.push(
        `${source}: server.workers is ${cfg.server?.workers}, but the demo runs in one process (its simulated fleet is in it). Fix: set server.workers to 1 (TROPA_WORKERS=1)`,
      )
  }
  if (problems.length > 0) throw new ConfigError(problems)

  const dataDir = resolve(cfg.server?.data_dir ?? './tropa-data')
  const sqlitePath = cfg.storage?.sqlite_path ?? 'tropa.db'
  return deepFreeze({
    source,
    server: {
      host: cfg.server?.host ?? '127.0.0.1',
      port: cfg.server?.port ?? 8080,
      dataDir,
      adminToken: cfg.server?.admin_token,
      maxBodyBytes: cfg.server?.max_body_bytes ?? 32 * 1024 * 1024,
      maxHeaderBytes: cfg.server?.max_header_bytes ?? 16 * 1024,
      streamWriteTimeoutMs: cfg.server?.stream_write_timeout_ms ?? 30_000,
      sseKeepAliveMs: cfg.server?.sse_keep_alive_ms ?? 15_000,
      shutdownGraceMs: cfg.server?.shutdown_grace_ms ?? 30_000,
      workers:
        cfg.server?.workers ??
        (demoEnabled || ((cfg.storage?.kind ?? 'sqlite') === 'sqlite' && sqlitePath === ':memory:')
          ? 1
          : availableParallelism()),
      logLevel: cfg.server?.log_level ?? 'info',
      billing: cfg.server?.billing ?? true,
      secret: cfg.server?.secret,
      publicUrl: publicUrl ?? undefined,
    },
    upstream: {
      connectTimeoutMs: cfg.upstream?.connect_timeout_ms ?? 3_000,
      firstByteTimeoutMs: cfg.upstream?.first_byte_timeout_ms ?? 60_000,
      idleTimeoutMs: cfg.upstream?.idle_timeout_ms ?? 60_000,
      maxAttempts: cfg.upstream?.max_attempts ?? 3,
    },
    routing: {
      policy: cfg.routing?.policy ?? 'predicted-ttft',
      hedgeShare: cfg.routing?.hedge_share ?? 0.05,
      retryShare: cfg.routing?.retry_share ?? 0.2,
      metricsPollMs: cfg.routing?.metrics_poll_ms ?? 1000,
      healthCheckMs: cfg.routing?.health_check_ms ?? 2000,
      prefixIndexBlocks: cfg.routing?.prefix_index_blocks ?? 32_768,
      sessionHeader: (cfg.routing?.session_header ?? 'x-session-id').toLowerCase(),
    },
    storage: {
      kind: cfg.storage?.kind ?? 'sqlite',
      sqlitePath: sqlitePath === ':memory:' ? sqlitePath : resolve(dataDir, sqlitePath),
      sqliteStartupCheck: cfg.storage?.sqlite_startup_check ?? 'quick',
      postgresUrl: cfg.storage?.postgres_url,
      postgresMaxConnections: cfg.storage?.postgres_max_connections ?? 10,
      statementTimeoutMs: cfg.storage?.statement_timeout_ms ?? 10_000,
      flushIntervalMs: cfg.storage?.flush_interval_ms ?? 250,
      ledgerQueueMax: cfg.storage?.ledger_queue_max ?? 100_000,
    },
    demo: { enabled: demoEnabled, nodes: cfg.demo?.nodes ?? 3, balanceNano: balance! },
    redis: {
      url: cfg.redis?.url,
      prefix: cfg.redis?.prefix ?? 'tropa:',
      revocationBoundMs: cfg.redis?.revocation_bound_ms ?? 1000,
      reservationLeaseMs: cfg.redis?.reservation_lease_ms ?? 5000,
    },
    console: {
      enabled: cfg.console?.enabled ?? true,
      sessionIdleSec: cfg.console?.session_idle_sec ?? 8 * 3600,
    },
    receipts: { enabled: cfg.receipts?.enabled ?? true, responses: cfg.receipts?.responses ?? false },
    responses: {
      retentionSec: (cfg.responses?.retention_days ?? 30) * 86_400,
      maxStoredBytes: cfg.responses?.max_stored_bytes ?? 8 * 1024 * 1024,
    },
    webhooks: {
      pollMs: cfg.webhooks?.poll_ms ?? 1000,
      timeoutMs: cfg.webhooks?.timeout_ms ?? 10_000,
      retryBaseMs: cfg.webhooks?.retry_base_ms ?? 30_000,
      retryMaxMs: cfg.webhooks?.retry_max_ms ?? 3_600_000,
      giveUpAfterMs: (cfg.webhooks?.give_up_after_sec ?? 86_400) * 1000,
      concurrency: cfg.webhooks?.concurrency ?? 8,
      allowPrivateUrls: cfg.webhooks?.allow_private_urls ?? false,
    },
    files: {
      dir: resolve(dataDir, 'files'),
      maxBytes: cfg.files?.max_bytes ?? 200 * 1024 * 1024,
      maxLines: cfg.files?.max_lines ?? 50_000,
      orphanGraceSec: cfg.files?.orphan_grace_sec ?? 3600,
      minFreeBytes: cfg.files?.min_free_bytes ?? 256 * 1024 * 1024,
    },
    batches: {
      workers: cfg.batches?.workers ?? 2,
      concurrency: cfg.batches?.concurrency ?? 64,
      windowSec: cfg.batches?.window_sec ?? 24 * 3600,
      interactiveReserve: cfg.batches?.interactive_reserve ?? 0,
      reserveSlots: cfg.batches?.reserve_slots ?? 1,
      busyShare: cfg.batches?.busy_share ?? 0,
      quietMs: cfg.batches?.quiet_ms ?? 1000,
      fillLoad: cfg.batches?.fill_load ?? FILL_LOAD,
      quietLoad: cfg.batches?.quiet_load ?? QUIET_LOAD,
      packShare: cfg.batches?.pack_share ?? PACK_SHARE,
      tickMs: cfg.batches?.tick_ms ?? 200,
      linkTtlSec: cfg.batches?.link_ttl_sec ?? 3600,
      maxAttempts: cfg.batches?.max_attempts ?? 5,
      leaseMs: cfg.batches?.lease_ms,
    },
    metrics: {
      requests: cfg.metrics?.requests ?? true,
      perOrg: cfg.metrics?.per_org ?? false,
      perOrgMax: cfg.metrics?.per_org_max ?? 100,
    },
    accessLog: {
      sink: cfg.access_log?.sink ?? 'off',
      path: resolve(dataDir, cfg.access_log?.path ?? 'access.log'),
      maxBytes: cfg.access_log?.max_bytes ?? 100 * 1024 * 1024,
      keep: cfg.access_log?.keep ?? 5,
      bufferLines: cfg.access_log?.buffer_lines ?? 10_000,
      bufferBytes: cfg.access_log?.buffer_bytes ?? 16 * 1024 * 1024,
      captureOrgs: cfg.access_log?.capture_orgs ?? [],
      captureKeys: cfg.access_log?.capture_keys ?? [],
      captureMaxChars: cfg.access_log?.capture_max_chars ?? 32_768,
    },
    tracing,
    models,
  } satisfies Config)
}

const SAMPLERS: ReadonlySet<string> = new Set(TRACE_SAMPLERS)

/**
 * Tracing from the file's [tracing] and OpenTelemetry's standard variables (which win):
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the traces URL), OTEL_EXPORTER_OTLP_ENDPOINT (a base, to
 * which /v1/traces is added), OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG;
 * OTEL_SDK_DISABLED=true turns it off. No endpoint: off.
 */
function tracingOf(cfg: ConfigFile, env: Env, problems: string[]): Config['tracing'] {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return undefined
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim()
  const endpoint =
    env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim() ||
    (base ? `${base.replace(/\/+$/, '')}/v1/traces` : undefined) ||
    cfg.tracing?.endpoint
  if (!endpoint) return undefined
  if (!/^https?:\/\/./.test(endpoint))
    problems.push(
      `environment: the OTLP traces endpoint ${JSON.stringify(endpoint)} is not an http(s) URL. Fix: e.g. http://collector:4318`,
    )
  const sampler = env.OTEL_TRACES_SAMPLER?.trim() || cfg.tracing?.sampler || 'parentbased_always_on'
  if (!SAMPLERS.has(sampler))
    problems.push(
      `environment: OTEL_TRACES_SAMPLER=${sampler} is not one Tropa knows. Fix: one of ${[...SAMPLERS].join(', ')}`,
    )
  const rawArg = env.OTEL_TRACES_SAMPLER_ARG?.trim()
  const samplerArg = rawArg ? Number(rawArg) : (cfg.tracing?.sampler_arg ?? 1)
  if (!(samplerArg >= 0 && samplerArg <= 1))
    problems.push(`environment: OTEL_TRACES_SAMPLER_ARG=${rawArg} is not a ratio from 0 to 1`)
  return {
    endpoint,
    serviceName: env.OTEL_SERVICE_NAME?.trim() || cfg.tracing?.service_name || 'tropa',
    sampler,
    samplerArg,
  }
}

/** Checks one model entry; also used for the demo's generated models. */
export function checkModel(m: ModelFile, where: string, env: Env, problems: string[]): ModelConfig {
  const kind = m.kind ?? 'chat'
  const routeList = m.routes ?? []
  if (routeList.length === 0)
    problems.push(
      `${where}: the model has no routes. Fix: add at least one [[models.routes]] with a base_url`,
    )
  if (m.max_output_tokens !== undefined && m.max_output_tokens > m.context_length)
    problems.push(
      `${where}: max_output_tokens ${m.max_output_tokens} is over context_length ${m.context_length}. Fix: the model's output cap, at most its context`,
    )
  if (kind === 'embedding' && m.dimensions === undefined)
    problems.push(`${where}: an embedding model needs dimensions (its native vector size)`)
  let promptNano = 0n
  let completionNano = 0n
  let cachedNano: NanoRub | undefined
  if (m.pricing && m.pricing_per_million)
    problems.push(`${where}: set either pricing or pricing_per_million, not both`)
  else if (m.pricing) {
    const p = parseRub(m.pricing.prompt, 6)
    const c = parseRub(m.pricing.completion, 6)
    if (p === undefined)
      problems.push(
        `${where}: pricing.prompt ${m.pricing.prompt} is not exact at six fractional digits per token. Fix: round it, e.g. "0.000030"`,
      )
    if (c === undefined)
      problems.push(
        `${where}: pricing.completion ${m.pricing.completion} is not exact at six fractional digits per token. Fix: round it, e.g. "0.000060"`,
      )
    promptNano = p ?? 0n
    completionNano = c ?? 0n
    if (m.pricing.cached_prompt !== undefined) {
      const cp = parseRub(m.pricing.cached_prompt, 6)
      if (cp === undefined)
        problems.push(
          `${where}: pricing.cached_prompt ${m.pricing.cached_prompt} is not exact at six fractional digits per token. Fix: round it, e.g. "0.000015"`,
        )
      cachedNano = cp
    }
  } else if (m.pricing_per_million) {
    const p = perMillionToPerTokenNano(m.pricing_per_million.prompt)
    const c = perMillionToPerTokenNano(m.pricing_per_million.completion)
    if (p === undefined)
      problems.push(
        `${where}: pricing_per_million.prompt ${m.pricing_per_million.prompt} is not a whole number of roubles per million, so the per-token price is not exact at six digits. Fix: use a whole number`,
      )
    if (c === undefined)
      problems.push(
        `${where}: pricing_per_million.completion ${m.pricing_per_million.completion} is not a whole number of roubles per million, so the per-token price is not exact at six digits. Fix: use a whole number`,
      )
    promptNano = p ?? 0n
    completionNano = c ?? 0n
    if (m.pricing_per_million.cached_prompt !== undefined) {
      const cp = perMillionToPerTokenNano(m.pricing_per_million.cached_prompt)
      if (cp === undefined)
        problems.push(
          `${where}: pricing_per_million.cached_prompt ${m.pricing_per_million.cached_prompt} is not a whole number of roubles per million, so the per-token price is not exact at six digits. Fix: use a whole number`,
        )
      cachedNano = cp
    }
  } else problems.push(`${where}: no pricing. Fix: add [models.pricing] with prompt and completion per token`)
  if (cachedNano !== undefined && cachedNano > promptNano)
    problems.push(
      `${where}: the cached prompt price is over the prompt price. Fix: at most the prompt price (a request is reserved for at the prompt price)`,
    )

  const routes = routeList.map((r, j) => {
    let url: URL | undefined
    try {
      url = new URL(r.base_url)
      if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error('protocol')
    } catch {
      problems.push(
        `${where}: routes[${j}].base_url ${JSON.stringify(r.base_url)} is not an http(s) URL. Fix: e.g. "http://10.0.0.5:8000/v1"`,
      )
    }
    let apiKey: string | undefined
    if (r.api_key_env) {
      apiKey = env[r.api_key_env]
      if (apiKey === undefined)
        problems.push(
          `${where}: routes[${j}].api_key_env names ${r.api_key_env}, which is not set. Fix: export it`,
        )
    }
    const provider = r.provider ?? 'openai'
    const need = (key: string, value: unknown, example: string) => {
      if (value === undefined)
        problems.push(
          `${where}: routes[${j}] (provider ${provider}) needs ${key}. Fix: e.g. ${key} = ${example}`,
        )
    }
    if (
      provider === 'anthropic' &&
      r.api_key_env === undefined &&
      !Object.keys(r.headers ?? {}).some((h) => /^(x-api-key|authorization)$/i.test(h))
    )
      need('api_key_env', undefined, '"ANTHROPIC_API_KEY" (sent as x-api-key)')
    if (provider === 'anthropic' && url && /\/v1\/?$/.test(url.pathname))
      problems.push(
        `${where}: routes[${j}].base_url ${JSON.stringify(r.base_url)} ends in /v1, but an anthropic base_url is the API root (the adapter appends /v1/messages). Fix: e.g. "https://api.anthropic.com"`,
      )
    if (provider === 'anthropic' && kind === 'embedding')
      problems.push(
        `${where}: routes[${j}] (provider anthropic): Anthropic has no embeddings API. Fix: serve this embedding model from another provider`,
      )
    if (provider === 'azure') need('api_version', r.api_version, '"2024-10-21"')
    if (provider === 'yandex') need('folder_id', r.folder_id, '"b1g..."')
    if (provider === 'gigachat')
      need('api_key_env', r.api_key_env, '"GIGACHAT_AUTH_KEY" (the authorization key)')
    // Gemini's base_url is the API root: the adapter appends /v1beta/models/<model>:<method>.
    if (provider === 'gemini' && url && /\/v1(?:beta)?(?:\/models)?\/?$/.test(url.pathname))
      problems.push(
        `${where}: routes[${j}].base_url ${JSON.stringify(r.base_url)} (provider gemini) must be the API root, without the version: the adapter appends /v1beta/models/<model>. Fix: "https://generativelanguage.googleapis.com"`,
      )
    let tlsCa: string | undefined
    if (r.tls_ca_file !== undefined) {
      try {
        tlsCa = readFileSync(r.tls_ca_file, 'utf8')
        if (!tlsCa.includes('-----BEGIN CERTIFICATE-----')) throw new Error('no PEM certificate in it')
      } catch (err) {
        problems.push(
          `${where}: routes[${j}].tls_ca_file ${JSON.stringify(r.tls_ca_file)} cannot be used (${(err as Error).message}). Fix: a readable PEM file of CA certificates`,
        )
      }
    }
    return {
      node: r.name ?? (url ? url.host : `route-${j}`),
      provider,
      baseUrl: r.base_url.replace(/\/+$/, ''),
      upstreamModel: r.upstream_model ?? m.id.slice(m.id.indexOf('/') + 1),
      apiKey,
      maxConcurrency: r.max_concurrency ?? 256,
      weight: r.weight ?? 1,
      firstByteTimeoutMs: r.first_byte_timeout_ms,
      hedge: r.hedge ?? !(r.billed_per_request ?? false),
      priorityScheduling: r.priority_scheduling ?? false,
      // Only OpenAI-compatible routes carry the warm-up's body as it is; a hosted API would bill it.
      // (undefined: on when the node reports Prometheus metrics, a self-hosted engine).
      warmSessions:
        provider !== 'openai'
          ? false
          : (r.warm_sessions ?? (r.billed_per_request === true ? false : undefined)),
      // Hosted providers have no Prometheus endpoint of their own.
      metricsUrl: r.metrics_url ?? (url && provider === 'openai' ? `${url.origin}/metrics` : ''),
      headers: r.headers ?? {},
      tlsCa,
      apiVersion: r.api_version,
      authUrl: r.auth_url,
      scope: r.scope,
      folderId: r.folder_id,
    }
  })
  return {
    id: m.id,
    ownedBy: m.owned_by ?? m.id.slice(0, m.id.indexOf('/')),
    kind,
    contextLength: m.context_length,
    maxOutputTokens: m.max_output_tokens,
    dimensions: m.dimensions,
    created: m.created ?? 1_767_225_600,
    price: { promptNano, completionNano, cachedPromptNano: cachedNano ?? promptNano },
    routes,
    fallbacks: m.fallbacks ?? [],
  }
}

function sectionOf(file: Record<string, unknown>, name: string): Record<string, unknown> {
  if (file[name] === undefined) file[name] = {}
  const section = file[name]
  // Not a table: the schema check reports it; overrides go nowhere meanwhile.
  return section !== null && typeof section === 'object' ? (section as Record<string, unknown>) : {}
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === 'object' && !Object.isFrozen(o)) {
    Object.freeze(o)
    for (const v of Object.values(o)) deepFreeze(v)
  }
  return o
}

/** A public base URL without its trailing slash; null when it is not an http(s) base. */
function checkPublicUrl(raw: string): string | null {
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    return null
  }
  if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.search || url.hash) return null
  if (url.username || url.password) return null
  return url.href.replace(/\/+$/, '')
}

/** Where links point when server.public_url is unset: the address Tropa listens on. */
export function listenUrl(host: string, port: number): string {
  return `http://${host.includes(':') ? `[${host}]` : host}:${port}`
}
