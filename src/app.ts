import { swagger } from '@elysiajs/swagger'
import { Elysia } from 'elysia'
import { errorMapper } from './http/error-mapper.ts'
import { adminRoutes } from './http/routes/admin.ts'
import { batchRoutes } from './http/routes/batches.ts'
import { chatRoutes } from './http/routes/chat.ts'
import { embeddingRoutes } from './http/routes/embeddings.ts'
import { fileRoutes } from './http/routes/files.ts'
import { healthRoutes } from './http/routes/health.ts'
import { keyRoutes } from './http/routes/keys.ts'
import { modelRoutes } from './http/routes/models.ts'
import { usageRoutes } from './http/routes/usage.ts'
import { requestId } from './ids.ts'
import type { Services } from './services.ts'

/** The HTTP app: request id, error mapper, docs, then the routes in the order a request meets them. */
export function createApp(svc: Services) {
  let table: { method: string; re: RegExp }[] = []
  const allowedMethods = (path: string): string[] => table.filter((r) => r.re.test(path)).map((r) => r.method)
  // Elysia's default normalisation drops undeclared fields; chat and embeddings must pass them
  // through, and key bodies reject them explicitly (additionalProperties: false).
  // Bun closes a connection that neither sends nor takes a byte for idleTimeout seconds (Elysia's
  // default 30). A stream whose client stopped reading is cut by Tropa at
  // server.stream_write_timeout_ms instead (it bills and aborts the upstream first), so Bun's
  // timer is kept a little longer than that.
  const idleTimeout = Math.max(30, Math.ceil(svc.config.server.streamWriteTimeoutMs / 1000) + 5)
  const app = new Elysia({ normalize: false, serve: { idleTimeout } })
    .onRequest(({ set }) => {
      set.headers['x-request-id'] = requestId()
    })
    .use(errorMapper(svc.log, allowedMethods))
    .use(
      swagger({
        path: '/docs',
        documentation: {
          info: {
            title: 'Tropa',
            version: '0.1.0',
            description: 'OpenAI-compatible model router billed in roubles',
          },
        },
      }),
    )
    .use(healthRoutes(svc))
    .use(modelRoutes(svc))
    .use(chatRoutes(svc))
    .use(embeddingRoutes(svc))
    .use(fileRoutes(svc))
    .use(batchRoutes(svc))
    .use(keyRoutes(svc))
    .use(usageRoutes(svc))
    .use(adminRoutes(svc))
  table = app.routes.map((r) => ({
    method: r.method,
    re: new RegExp(`^${r.path.replace(/:[^/]+/g, '[^/]+').replace(/\*/g, '.*')}/?$`),
  }))
  return app
}
export type App = ReturnType<typeof createApp>
