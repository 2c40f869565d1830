import { Elysia } from 'elysia'
import { errorMapper } from './http/error-mapper.ts'
import { adminRoutes } from './http/routes/admin.ts'
import { batchRoutes } from './http/routes/batches.ts'
import { chatRoutes } from './http/routes/chat.ts'
import { docsRoutes } from './http/routes/docs.ts'
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
  const app = new Elysia({ normalize: false })
    .onRequest(({ set }) => {
      set.headers['x-request-id'] = requestId()
    })
    .use(errorMapper(svc.log, allowedMethods))
    .use(docsRoutes())
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
