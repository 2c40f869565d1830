import { Elysia } from 'elysia'
import { HeadersTooLarge } from './errors.ts'
import { errorMapper } from './http/error-mapper.ts'
import { activityRoutes } from './http/routes/activity.ts'
import { adminRoutes } from './http/routes/admin.ts'
import { batchRoutes } from './http/routes/batches.ts'
import { chatRoutes } from './http/routes/chat.ts'
import { completionRoutes } from './http/routes/completions.ts'
import { consoleRoutes } from './http/routes/console.ts'
import { docsRoutes } from './http/routes/docs.ts'
import { embeddingRoutes } from './http/routes/embeddings.ts'
import { fileRoutes } from './http/routes/files.ts'
import { healthRoutes } from './http/routes/health.ts'
import { keyRoutes } from './http/routes/keys.ts'
import { messageRoutes } from './http/routes/messages.ts'
import { modelRoutes } from './http/routes/models.ts'
import { receiptRoutes } from './http/routes/receipts.ts'
import { responseRoutes } from './http/routes/responses.ts'
import { usageRoutes } from './http/routes/usage.ts'
import { webhookRoutes } from './http/routes/webhooks.ts'
import { requestId } from './ids.ts'
import type { Services } from './services.ts'

/**
 * The runtime's body cap: none in practice (2^53 - 1 bytes). A finite one would answer a declared
 * length above it with an empty 413 before Tropa sees the request (checked with raw sockets).
 */
export const RUNTIME_BODY_CAP = Number.MAX_SAFE_INTEGER

/**
 * The runtime's own header limit, set where Tropa is started (`--max-http-header-size`, in
 * package.json's scripts and baked into the executable by `bun build --compile-exec-argv`): four
 * times Bun's default, so that Tropa's limit (server.max_header_bytes, at most 60 KiB) refuses
 * first with an error body. Past this the runtime answers a bare 431.
 */
export const RUNTIME_HEADER_BYTES = 65536

/**
 * Whether the request's headers (names and values) exceed `max` bytes. forEach, not for-of: no
 * iterator and no [name, value] array per header on every request; the runtime's own limit
 * (RUNTIME_HEADER_BYTES) bounds the walk.
 */
function headersOver(headers: Headers, max: number): boolean {
  let n = 0
  headers.forEach((v, k) => {
    n += k.length + v.length + 4
  })
  return n > max
}

/** The HTTP app: request id, error mapper, docs, then the routes in the order a request meets them. */
export function createApp(
  svc: Services,
  /** Workers of one Tropa share the port (src/workers/); alone, the port is never shared. */
  o: { readonly reusePort?: boolean } = {},
) {
  const maxHeaderBytes = svc.config.server.maxHeaderBytes
  let table: { method: string; re: RegExp }[] = []
  // The console hands its calls to this same app (set once it is built).
  let handle: (request: Request) => Promise<Response> = () => Promise.reject(new Error('not started'))
  const allowedMethods = (path: string): string[] => table.filter((r) => r.re.test(path)).map((r) => r.method)
  // Elysia's default normalisation drops undeclared fields; chat and embeddings must pass them
  // through, and key bodies reject them explicitly (additionalProperties: false).
  // Bun closes a connection that neither sends nor takes a byte for idleTimeout seconds (Elysia's
  // default 30). A stream whose client stopped reading is cut by Tropa at
  // server.stream_write_timeout_ms instead (it bills and aborts the upstream first), so Bun's
  // timer is kept a little longer than that.
  const idleTimeout = Math.max(30, Math.ceil(svc.config.server.streamWriteTimeoutMs / 1000) + 5)
  const app = new Elysia({
    normalize: false,
    // The runtime's own body cap (Bun's default is 128 MiB, under files.max_bytes) answers an
    // empty 413 before any route runs, or cuts a chunked body off with no answer at all. Tropa's
    // readers enforce the configured limits themselves (server.max_body_bytes for JSON,
    // files.max_bytes for uploads: by Content-Length before reading, by counting while reading),
    // so the runtime's is lifted out of their way and every 413 carries OpenAI's error body.
    // Elysia turns on SO_REUSEPORT: a second Tropa started on a port in use would then share it
    // silently, each answering a part of the connections with its own keys. Off, the second
    // start fails (address in use). Only a Tropa's own workers share it: their primary has checked
    // the port is free (listening without the option) before starting them. Bun's development mode (error pages) is off whatever
    // NODE_ENV says.
    serve: {
      maxRequestBodySize: RUNTIME_BODY_CAP,
      idleTimeout,
      reusePort: o.reusePort === true,
      development: false,
    },
  })
    .onRequest(({ request, set }) => {
      const id = requestId()
      set.headers['x-request-id'] = id
      svc.telemetry.begin(id, request)
      svc.tracing?.arrived(request)
      // Stopping: a request that came on a kept-alive connection is answered, and the connection
      // closed after it, so the client opens its next one elsewhere.
      if (svc.draining) set.headers.connection = 'close'
      // Tropa's own header limit, below the runtime's (RUNTIME_HEADER_BYTES, whose refusal has no
      // body), so that a 431 carries OpenAI's error body like every other refusal.
      if (headersOver(request.headers, maxHeaderBytes)) throw new HeadersTooLarge(maxHeaderBytes)
    })
    .use(
      errorMapper(
        svc.log,
        allowedMethods,
        (err) => svc.files.disk?.report(err),
        (id, status) => svc.telemetry.failed(id, status),
      ),
    )
    .use(docsRoutes())
    .use(healthRoutes(svc))
    .use(receiptRoutes(svc))
    .use(modelRoutes(svc))
    .use(chatRoutes(svc))
    .use(completionRoutes(svc))
    .use(responseRoutes(svc))
    .use(messageRoutes(svc))
    .use(embeddingRoutes(svc))
    .use(fileRoutes(svc))
    .use(batchRoutes(svc))
    .use(keyRoutes(svc))
    .use(usageRoutes(svc))
    .use(activityRoutes(svc))
    .use(webhookRoutes(svc))
    .use(adminRoutes(svc))
    // The web console (and `/` redirecting to it): its API calls are handed to the routes above.
    .use(svc.config.console.enabled ? consoleRoutes(svc, (r) => handle(r)) : new Elysia())
  handle = (r) => app.handle(r)
  table = app.routes.map((r) => ({
    method: r.method,
    re: new RegExp(`^${r.path.replace(/:[^/]+/g, '[^/]+').replace(/\*/g, '.*')}/?$`),
  }))
  return app
}
export type App = ReturnType<typeof createApp>
