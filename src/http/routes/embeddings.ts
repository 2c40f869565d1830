import { Elysia } from 'elysia'
import { EmbeddingRequest } from '../../api/embeddings.ts'
import { createEmbeddings } from '../../pipeline/embeddings.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst, payerOf } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'

export const embeddingRoutes = (svc: Services) =>
  new Elysia().derive(authenticate(svc)).post(
    '/v1/embeddings',
    ({ principal, body, request, set }) => {
      const id = set.headers['x-request-id'] as string
      return svc.telemetry.answered(
        id,
        createEmbeddings(
          svc.deps,
          payerOf(principal, request.headers, { user: (body as EmbeddingRequest).user, quotes: false }),
          body as EmbeddingRequest,
          request.signal,
          id,
        ),
        body,
      )
    },
    {
      parse: jsonBody(svc.config.server.maxBodyBytes, EmbeddingRequest, authenticateFirst(svc)),
      detail: {
        tags: ['embeddings'],
        summary: 'Embeddings of up to 2048 inputs',
        requestBody: jsonRequestBody(EmbeddingRequest),
      },
    },
  )
