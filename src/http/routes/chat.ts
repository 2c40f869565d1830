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
      const payer = payerOf(principal, request.headers, { user: (body as ChatRequest).user })
      const requestId = set.headers['x-request-id'] as string
      const trace = svc.tracing?.begin(request, 'chat', {
        'gen_ai.operation.name': 'chat',
        'gen_ai.request.model': (body as ChatRequest).model,
        'tropa.request_id': requestId,
        'tropa.key_id': payer.key.id,
        'tropa.org_id': payer.org.id,
      })
      const answer = chatCompletion(
        svc.deps,
        payer,
        body as ChatRequest,
        request.signal,
        requestId,
        request.headers.get(svc.config.routing.sessionHeader) ?? undefined,
        () => server?.timeout(request, 1),
        trace,
      )
      // A success ends the trace when it is billed (a stream's end); a refusal ends it here.
      return svc.telemetry.answered(
        requestId,
        trace
          ? answer.catch((err) => {
              trace.end(undefined, err)
              throw err
            })
          : answer,
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
