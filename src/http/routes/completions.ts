import { Elysia } from 'elysia'
import { CompletionRequest } from '../../api/completions.ts'
import { textCompletion } from '../../pipeline/completions.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst, payerOf } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'

export const completionRoutes = (svc: Services) =>
  new Elysia().derive(authenticate(svc)).post(
    '/v1/completions',
    ({ principal, body, request, set, server }) => {
      const id = set.headers['x-request-id'] as string
      return svc.telemetry.answered(
        id,
        textCompletion(
          svc.deps,
          payerOf(principal, request.headers, { user: (body as CompletionRequest).user }),
          body as CompletionRequest,
          request.signal,
          id,
          request.headers.get(svc.config.routing.sessionHeader) ?? undefined,
          () => server?.timeout(request, 1),
        ),
        body,
      )
    },
    {
      parse: jsonBody(svc.config.server.maxBodyBytes, CompletionRequest, authenticateFirst(svc)),
      detail: {
        tags: ['completions'],
        summary: 'Legacy text completion on a chat model (JSON, or SSE with stream: true)',
        requestBody: jsonRequestBody(CompletionRequest),
      },
    },
  )
