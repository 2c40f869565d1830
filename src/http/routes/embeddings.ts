import { Elysia } from 'elysia'
import { EmbeddingRequest } from '../../api/embeddings.ts'
import { createEmbeddings } from '../../pipeline/embeddings.ts'
import type { Services } from '../../services.ts'
import { authenticate } from '../auth.ts'
import { jsonReader, jsonRequestBody } from '../body.ts'
import { answerModelCall } from './model-call.ts'

export const embeddingRoutes = (svc: Services) => {
  const readEmbeddings = jsonReader(svc.config.server.maxBodyBytes, EmbeddingRequest)
  return new Elysia().derive(authenticate(svc)).post(
    '/v1/embeddings',
    async ({ principal, request, set, server }) => {
      const body = await readEmbeddings(request)
      const shape = {
        operation: 'embeddings',
        endpoint: 'embeddings',
        model: body.model,
        user: body.user,
        quotes: false,
      } as const
      return answerModelCall(svc, { principal, request, set, server }, body, shape, (c) =>
        createEmbeddings(svc.deps, c.payer, body, c.signal, c.requestId, c.trace),
      )
    },
    {
      detail: {
        tags: ['embeddings'],
        summary: 'Embeddings of up to 2048 inputs',
        requestBody: jsonRequestBody(EmbeddingRequest),
      },
    },
  )
}
