import { type Static, Type as T } from '@sinclair/typebox'

/** Roubles as decimal text, e.g. "0.000030". Checked for exactness in load.ts. */
const Decimal = T.String({ pattern: '^\\d+(\\.\\d+)?$', description: 'decimal text, e.g. "0.000030"' })

export const PricingSchema = T.Object(
  {
    prompt: Decimal,
    completion: Decimal,
    /** Prompt tokens the upstream reports as cached (prompt_tokens_details.cached_tokens); default: the prompt price. */
    cached_prompt: T.Optional(Decimal),
  },
  { additionalProperties: false },
)

/** The provider kinds a route may name; each has an adapter in src/upstream/providers/<kind>/. */
export const PROVIDER_KINDS = ['openai', 'azure', 'anthropic', 'gemini', 'gigachat', 'yandex'] as const
export type ProviderKind = (typeof PROVIDER_KINDS)[number]

export const RouteSchema = T.Object(
  {
    /** Which protocol the upstream speaks (default "openai": any OpenAI-compatible server). */
    provider: T.Optional(T.Union(PROVIDER_KINDS.map((k) => T.Literal(k)))),
    base_url: T.String({ description: "the provider's API root (OpenAI-compatible: including /v1)" }),
    upstream_model: T.Optional(T.String({ minLength: 1 })),
    api_key_env: T.Optional(T.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' })),
    max_concurrency: T.Optional(T.Integer({ minimum: 1, maximum: 100_000 })),
    weight: T.Optional(T.Number({ exclusiveMinimum: 0 })),
    name: T.Optional(T.String({ minLength: 1 })),
    /** Overrides upstream.first_byte_timeout_ms for this route. */
    first_byte_timeout_ms: T.Optional(T.Integer({ minimum: 1 })),
    /** A hosted API that bills per request: no hedged copies unless `hedge = true`. */
    billed_per_request: T.Optional(T.Boolean()),
    /** Whether a late first token may be hedged to another node (default: not billed_per_request). */
    hedge: T.Optional(T.Boolean()),
    /** The node runs vLLM with `--scheduling-policy priority`: batch lines go at the lowest priority. */
    priority_scheduling: T.Optional(T.Boolean()),
    /**
     * A new session that routing spreads away from the node holding its cached prefix is served
     * there once, and its new node is warmed with the same prompt (one token out, answered to no
     * one). Default: on for a node that reports Prometheus metrics (a self-hosted engine) on an
     * OpenAI-compatible route not billed per request. Only OpenAI-compatible routes.
     */
    warm_sessions: T.Optional(T.Boolean()),
    /** The node's Prometheus metrics (vLLM, llama.cpp); default: <origin of base_url>/metrics. */
    metrics_url: T.Optional(T.String()),
    /** azure: the `api-version` query parameter. */
    api_version: T.Optional(T.String({ minLength: 1 })),
    /** gigachat: the OAuth endpoint (default https://ngw.devices.sberbank.ru:9443/api/v2/oauth). */
    auth_url: T.Optional(T.String({ minLength: 1 })),
    /** gigachat: the OAuth scope (default GIGACHAT_API_PERS). */
    scope: T.Optional(T.String({ minLength: 1 })),
    /** yandex: the folder of the model URIs (gpt://<folder_id>/<model>). */
    folder_id: T.Optional(T.String({ minLength: 1 })),
    /** A PEM file of CA certificates to trust for this route (GigaChat: the Russian Trusted Root CA). */
    tls_ca_file: T.Optional(T.String({ minLength: 1 })),
    /** Extra static headers sent with every request of this route. */
    headers: T.Optional(T.Record(T.String({ pattern: '^[A-Za-z0-9-]+$' }), T.String())),
  },
  { additionalProperties: false },
)

export const ModelSchema = T.Object(
  {
    id: T.String({ pattern: '^[A-Za-z0-9._-]+/[A-Za-z0-9._:-]+$', description: '<provider>/<model_name>' }),
    owned_by: T.Optional(T.String({ minLength: 1 })),
    kind: T.Optional(T.Union([T.Literal('chat'), T.Literal('embedding')])),
    context_length: T.Integer({ minimum: 1 }),
    /** The most tokens one answer may have (a hosted model's output cap): the bound when a request sets none. */
    max_output_tokens: T.Optional(T.Integer({ minimum: 1 })),
    /** Native vector size of an embedding model. */
    dimensions: T.Optional(T.Integer({ minimum: 1 })),
    /** Roubles per token, exactly six fractional digits. */
    pricing: T.Optional(PricingSchema),
    /** Roubles per million tokens; must convert to a per-token price exact at six digits. */
    pricing_per_million: T.Optional(PricingSchema),
    created: T.Optional(T.Integer({ minimum: 0 })),
    routes: T.Optional(T.Array(RouteSchema)),
    /** Chat models tried in order when every node of this one failed or is unavailable. */
    fallbacks: T.Optional(T.Array(T.String({ minLength: 1 }), { maxItems: 8 })),
  },
  { additionalProperties: false },
)

export const ServerSchema = T.Object(
  {
    host: T.Optional(T.String()),
    port: T.Optional(T.Integer({ minimum: 0, maximum: 65535 })),
    data_dir: T.Optional(T.String({ minLength: 1 })),
    admin_token: T.Optional(T.String({ minLength: 16 })),
    /** Signs download links; generated into the store when unset (set it when nodes share links). */
    secret: T.Optional(T.String({ minLength: 32 })),
    max_body_bytes: T.Optional(T.Integer({ minimum: 1024 })),
    /** Request headers above this get Tropa's 431 (the runtime's own limit is RUNTIME_HEADER_BYTES). */
    max_header_bytes: T.Optional(T.Integer({ minimum: 1024, maximum: 60 * 1024 })),
    /** The base of links Tropa hands out (batch downloads); default http://<host>:<port>. */
    public_url: T.Optional(T.String({ minLength: 1 })),
    /** A stream whose client takes no bytes for this long is cut (upstream aborted, billed so far). */
    stream_write_timeout_ms: T.Optional(T.Integer({ minimum: 100, maximum: 240_000 })),
    /** A stream with no first token this long after it began gets its headers and `: keep-alive` comments, then again every this long; 0: off. */
    sse_keep_alive_ms: T.Optional(T.Integer({ minimum: 0, maximum: 600_000 })),
    /** On SIGTERM, in-flight requests and streams may finish for this long; then open streams are ended. */
    shutdown_grace_ms: T.Optional(T.Integer({ minimum: 0, maximum: 3_600_000 })),
    /** Processes serving the port, sharing it with SO_REUSEPORT (docs/workers.md); default: the cores. */
    workers: T.Optional(T.Integer({ minimum: 1, maximum: 1024 })),
    /** false: no reservation, charge or ledger row (benchmarks of the money path only). */
    billing: T.Optional(T.Boolean()),
    log_level: T.Optional(
      T.Union([T.Literal('debug'), T.Literal('info'), T.Literal('warn'), T.Literal('error')]),
    ),
  },
  { additionalProperties: false },
)

export const UpstreamSchema = T.Object(
  {
    connect_timeout_ms: T.Optional(T.Integer({ minimum: 1 })),
    first_byte_timeout_ms: T.Optional(T.Integer({ minimum: 1 })),
    idle_timeout_ms: T.Optional(T.Integer({ minimum: 1 })),
    max_attempts: T.Optional(T.Integer({ minimum: 1, maximum: 10 })),
  },
  { additionalProperties: false },
)

export const RoutingSchema = T.Object(
  {
    /** predicted-ttft (default): the node whose first token is predicted soonest; least-in-flight. */
    policy: T.Optional(T.Union([T.Literal('predicted-ttft'), T.Literal('least-in-flight')])),
    /** Share of requests that may be hedged (a copy to a second node when the first token is late); 0: off. */
    hedge_share: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
    /** Share of requests that may fail over to another node, beyond a burst of 10. */
    retry_share: T.Optional(T.Number({ minimum: 0, maximum: 10 })),
    /** Poll each node's /metrics this often; 0: off. */
    metrics_poll_ms: T.Optional(T.Integer({ minimum: 0, maximum: 600_000 })),
    /** Probe ejected and idle nodes this often; 0: off. */
    health_check_ms: T.Optional(T.Integer({ minimum: 0, maximum: 600_000 })),
    /** Prefix index size per node, in blocks of 256 characters. */
    prefix_index_blocks: T.Optional(T.Integer({ minimum: 0, maximum: 10_000_000 })),
    /** Header carrying a session id (ties go to the session's node); the `user` field works too. */
    session_header: T.Optional(T.String({ minLength: 1 })),
  },
  { additionalProperties: false },
)

export const StorageSchema = T.Object(
  {
    kind: T.Optional(T.Union([T.Literal('sqlite'), T.Literal('postgres')])),
    /** PostgreSQL URL when kind is "postgres" (also TROPA_POSTGRES_URL). */
    postgres_url: T.Optional(T.String({ pattern: '^postgres(ql)?://' })),
    postgres_max_connections: T.Optional(T.Integer({ minimum: 1, maximum: 1000 })),
    statement_timeout_ms: T.Optional(T.Integer({ minimum: 1 })),
    /** SQLite file; relative paths are inside data_dir. */
    sqlite_path: T.Optional(T.String({ minLength: 1 })),
    /** How the SQLite file is read through at start; a damaged one stops the start. */
    sqlite_startup_check: T.Optional(T.Union([T.Literal('quick'), T.Literal('full'), T.Literal('off')])),
    /** Ledger group commit: rows are written at most this long after a request ends. */
    flush_interval_ms: T.Optional(T.Integer({ minimum: 1, maximum: 1000 })),
    /** Ledger rows held in memory while the store is unreachable; beyond it billed requests get 503. */
    ledger_queue_max: T.Optional(T.Integer({ minimum: 1 })),
  },
  { additionalProperties: false },
)

export const DemoSchema = T.Object(
  {
    enabled: T.Optional(T.Boolean()),
    /** Simulated nodes started in-process when the demo runs without models configured. */
    nodes: T.Optional(T.Integer({ minimum: 1, maximum: 16 })),
    /** Starting balance of the demo organization. */
    balance_rub: T.Optional(Decimal),
  },
  { additionalProperties: false },
)

export const FilesSchema = T.Object(
  {
    max_bytes: T.Optional(T.Integer({ minimum: 1 })),
    max_lines: T.Optional(T.Integer({ minimum: 1 })),
    /** Uploads are refused (507) when they would leave less free space than this: room kept for the database. */
    min_free_bytes: T.Optional(T.Integer({ minimum: 0 })),
    /** Temporary and row-less files idle this long are removed at start-up (other nodes may share the directory). */
    orphan_grace_sec: T.Optional(T.Integer({ minimum: 0 })),
  },
  { additionalProperties: false },
)

export const BatchesSchema = T.Object(
  {
    /** Worker threads that validate files and run lines. */
    workers: T.Optional(T.Integer({ minimum: 1, maximum: 64 })),
    /** Lines one worker keeps in flight. */
    concurrency: T.Optional(T.Integer({ minimum: 1, maximum: 10_000 })),
    /** The completion window; "24h" per the API, shorter in tests. */
    window_sec: T.Optional(T.Integer({ minimum: 1 })),
    /** Share of every node's max_concurrency that batch lines leave free on a node with no interactive traffic. */
    interactive_reserve: T.Optional(T.Number({ minimum: 0, maximum: 0.95 })),
    /** Slots of every node batch lines leave free whatever the shares say (a node of one slot still takes one line). */
    reserve_slots: T.Optional(T.Integer({ minimum: 0, maximum: 10_000 })),
    /** Share of every node's max_concurrency batch lines may keep while interactive traffic is active there. */
    busy_share: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
    /** A node takes batch lines once no interactive request has been in flight there for this long. */
    quiet_ms: T.Optional(T.Integer({ minimum: 0, maximum: 60_000 })),
    /** The fleet's interactive load (in flight over slots) at or under which lines fill every node, one slot kept free. */
    fill_load: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
    /** The fleet's interactive load over which even a quiet node takes no line. */
    quiet_load: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
    /** At or under quiet_load, interactive traffic keeps to nodes filled to at most this share of their slots; the batch has the rest whole (0: off). */
    pack_share: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
    tick_ms: T.Optional(T.Integer({ minimum: 10, maximum: 10_000 })),
    link_ttl_sec: T.Optional(T.Integer({ minimum: 1 })),
    max_attempts: T.Optional(T.Integer({ minimum: 1, maximum: 20 })),
    /** How long a leased line stays with its node before others may take it; default max(60 s, 2 x first_byte_timeout). */
    lease_ms: T.Optional(T.Integer({ minimum: 100 })),
  },
  { additionalProperties: false },
)

export const ResponsesSchema = T.Object(
  {
    /** Stored responses (POST /v1/responses with store) older than this are deleted; 0 keeps them. */
    retention_days: T.Optional(T.Integer({ minimum: 0, maximum: 3650 })),
    /** Largest conversation a stored response may hold (400 past it). */
    max_stored_bytes: T.Optional(T.Integer({ minimum: 1024, maximum: 256 * 1024 * 1024 })),
  },
  { additionalProperties: false },
)

export const WebhooksSchema = T.Object(
  {
    /** How often a node looks for events due in the outbox. */
    poll_ms: T.Optional(T.Integer({ minimum: 10, maximum: 60_000 })),
    /** One attempt's limit (connect, answer and the first KiB of its body). */
    timeout_ms: T.Optional(T.Integer({ minimum: 100, maximum: 120_000 })),
    /** The first retry's delay; each next one doubles (with jitter) up to retry_max_ms. */
    retry_base_ms: T.Optional(T.Integer({ minimum: 10, maximum: 3_600_000 })),
    retry_max_ms: T.Optional(T.Integer({ minimum: 10, maximum: 24 * 3_600_000 })),
    /** An event not delivered this long after it happened is given up (status failed). */
    give_up_after_sec: T.Optional(T.Integer({ minimum: 1, maximum: 30 * 86_400 })),
    /** Deliveries one node has in flight at once. */
    concurrency: T.Optional(T.Integer({ minimum: 1, maximum: 256 })),
    /** Webhook URLs may name loopback and private addresses (tests, a receiver on the same network). */
    allow_private_urls: T.Optional(T.Boolean()),
  },
  { additionalProperties: false },
)

export const RedisSchema = T.Object(
  {
    /** Redis for the cluster bus (several nodes on one PostgreSQL); also TROPA_REDIS_URL. */
    url: T.Optional(T.String({ pattern: '^rediss?://' })),
    /** Prefix of every key and channel, so several clusters (or tests) can share a Redis. */
    prefix: T.Optional(T.String({ minLength: 1 })),
    /** How long a node may go without hearing the bus before it checks keys against the store. */
    revocation_bound_ms: T.Optional(T.Integer({ minimum: 50, maximum: 60_000 })),
    /** A node silent this long is dead: other nodes give back the money its requests held. */
    reservation_lease_ms: T.Optional(T.Integer({ minimum: 200, maximum: 600_000 })),
  },
  { additionalProperties: false },
)

export const MetricsSchema = T.Object(
  {
    /**
     * Record request-level metrics (tropa_request_duration_seconds and the rest; default true).
     * false: no request series (x-tropa-overhead-ms and the access log are kept); for measuring
     * what recording costs.
     */
    requests: T.Optional(T.Boolean()),
    /** Label requests, tokens and roubles by organization (off by default: one series per org). */
    per_org: T.Optional(T.Boolean()),
    /** Distinct organizations labelled; later ones are counted under org="other". */
    per_org_max: T.Optional(T.Integer({ minimum: 1, maximum: 10_000 })),
  },
  { additionalProperties: false },
)

export const AccessLogSchema = T.Object(
  {
    /** One JSON line per request to a model endpoint: off (default), stderr, or a file. */
    sink: T.Optional(T.Union([T.Literal('off'), T.Literal('stderr'), T.Literal('file')])),
    /** The file (sink "file"), relative to server.data_dir; default access.log. */
    path: T.Optional(T.String({ minLength: 1 })),
    /** Rotate the file before it grows past this many bytes. */
    max_bytes: T.Optional(T.Integer({ minimum: 4096 })),
    /** Rotated files kept (access.log.1 …). */
    keep: T.Optional(T.Integer({ minimum: 0, maximum: 100 })),
    /** Lines held while the sink is busy; past this they are dropped and counted. */
    buffer_lines: T.Optional(T.Integer({ minimum: 1, maximum: 1_000_000 })),
    /** Bytes held while the sink is busy (captured bodies make lines big); past this, dropped. */
    buffer_bytes: T.Optional(T.Integer({ minimum: 65_536, maximum: 1024 * 1024 * 1024 })),
    /** Organizations whose request and response bodies are written into their lines (redacted). */
    capture_orgs: T.Optional(T.Array(T.String({ minLength: 1 }), { maxItems: 10_000 })),
    /** API keys (key ids) whose request and response bodies are written into their lines. */
    capture_keys: T.Optional(T.Array(T.String({ minLength: 1 }), { maxItems: 10_000 })),
    /** A captured body longer than this many characters is cut there. */
    capture_max_chars: T.Optional(T.Integer({ minimum: 256, maximum: 16 * 1024 * 1024 })),
  },
  { additionalProperties: false },
)

/** The samplers OTEL_TRACES_SAMPLER (and tracing.sampler) may name: OpenTelemetry's standard ones. */
export const TRACE_SAMPLERS = [
  'always_on',
  'always_off',
  'traceidratio',
  'parentbased_always_on',
  'parentbased_always_off',
  'parentbased_traceidratio',
] as const

export const TracingSchema = T.Object(
  {
    /** The OTLP/HTTP traces URL (e.g. http://collector:4318/v1/traces); the OTEL_* variables override it. Unset: tracing off. */
    endpoint: T.Optional(T.String({ pattern: '^https?://' })),
    service_name: T.Optional(T.String({ minLength: 1 })),
    sampler: T.Optional(T.Union(TRACE_SAMPLERS.map((s) => T.Literal(s)))),
    /** The ratio of the traceidratio samplers. */
    sampler_arg: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
  },
  { additionalProperties: false },
)

/** The config file as written by an operator (TOML or JSON). */
export const ConsoleSchema = T.Object(
  {
    /** Serve the web console at /console (and redirect / there). */
    enabled: T.Optional(T.Boolean()),
    /** A console session unused for this long is signed out. */
    session_idle_sec: T.Optional(T.Integer({ minimum: 60, maximum: 30 * 86_400 })),
  },
  { additionalProperties: false },
)

/** Signed receipts on billed responses (docs/api.md, "Receipts"). */
export const ReceiptsSchema = T.Object(
  {
    /** Signing keys, /.well-known/tropa-receipts.json, and a receipt on every row of a JSONL export. */
    enabled: T.Optional(T.Boolean()),
    /** Sign every billed response too (x-tropa-receipt, usage.receipt): costs each request (docs/config.md). */
    responses: T.Optional(T.Boolean()),
  },
  { additionalProperties: false },
)

export const ConfigFileSchema = T.Object(
  {
    server: T.Optional(ServerSchema),
    upstream: T.Optional(UpstreamSchema),
    routing: T.Optional(RoutingSchema),
    storage: T.Optional(StorageSchema),
    demo: T.Optional(DemoSchema),
    files: T.Optional(FilesSchema),
    batches: T.Optional(BatchesSchema),
    redis: T.Optional(RedisSchema),
    responses: T.Optional(ResponsesSchema),
    webhooks: T.Optional(WebhooksSchema),
    metrics: T.Optional(MetricsSchema),
    access_log: T.Optional(AccessLogSchema),
    tracing: T.Optional(TracingSchema),
    console: T.Optional(ConsoleSchema),
    receipts: T.Optional(ReceiptsSchema),
    models: T.Optional(T.Array(ModelSchema)),
  },
  { additionalProperties: false },
)
export type ConfigFile = Static<typeof ConfigFileSchema>
export type ModelFile = Static<typeof ModelSchema>
