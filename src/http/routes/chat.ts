import { Elysia } from 'elysia'
import { ChatRequest } from '../../api/chat.ts'
import { chatCompletion } from '../../pipeline/chat.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst, payerOf } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'

export const chatRoutes = (svc: Services) =>
  new Elysia().derive(authenticate(svc)).post(
    '/v1/chat/completions',
    ({ principal, body, request, set, server }) => {
      const id = set.headers['x-request-id'] as string
      return svc.telemetry.answered(
        id,
        chatCompletion(
          svc.deps,
          payerOf(principal, request.headers),
          body as ChatRequest,
          request.signal,
          id,
          request.headers.get(svc.config.routing.sessionHeader) ?? undefined,
          () => server?.timeout(request, 1),
        ),
        body,
      )
    },
    {
      parse: jsonBody(svc.config.server.maxBodyBytes, ChatRequest, authenticateFirst(svc)),
      detail: {
        tags: ['chat'],
        summary: 'Chat completion (JSON, or SSE with stream: true)',
        requestBody: jsonRequestBody(ChatRequest),
      },
    },
  )
