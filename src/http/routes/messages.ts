import { Elysia } from 'elysia'
import { CountTokensRequest, MessagesRequest } from '../../api/messages.ts'
import { countMessageTokens, createMessage } from '../../pipeline/messages.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst, payerOf } from '../auth.ts'
import { jsonBody, jsonReader, jsonRequestBody } from '../body.ts'
import { answerModelCall } from './model-call.ts'

/**
 * The Anthropic Messages API on any catalogue chat model (docs/api.md, Messages). Auth by
 * `x-api-key` or Bearer; `anthropic-version` and `anthropic-beta` are accepted and not read.
 * Errors on these paths take Anthropic's shape (error-mapper.ts).
 */
export const messageRoutes = (svc: Services) => {
  const readMessages = jsonReader(svc.config.server.maxBodyBytes, MessagesRequest)
  return new Elysia()
    .derive(authenticate(svc))
    .post(
      '/v1/messages',
      async ({ principal, request, set, server }) => {
        const body = await readMessages(request)
        const shape = {
          operation: 'chat',
          endpoint: 'messages',
          model: body.model,
          user: body.metadata?.user_id,
          userParam: 'metadata.user_id',
        }
        return answerModelCall(svc, { principal, request, set, server }, body, shape, (c) =>
          createMessage(svc.deps, c.payer, body, c.signal, c.requestId, c.sessionHint, c.cut, c.trace),
        )
      },
      {
        detail: {
          tags: ['messages'],
          summary: 'Anthropic Messages API (JSON, or SSE with stream: true) on any chat model',
          requestBody: jsonRequestBody(MessagesRequest),
        },
      },
    )
    .post(
      '/v1/messages/count_tokens',
      ({ principal, body }) => {
        payerOf(principal)
        return countMessageTokens(svc.deps, body as CountTokensRequest)
      },
      {
        parse: jsonBody(svc.config.server.maxBodyBytes, CountTokensRequest, authenticateFirst(svc)),
        detail: {
          tags: ['messages'],
          summary: "A Messages request's input tokens, counted as chat counts them",
          requestBody: jsonRequestBody(CountTokensRequest),
        },
      },
    )
}
