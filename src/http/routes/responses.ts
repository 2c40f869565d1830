import { Elysia, t } from 'elysia'
import { knownTypeError, ResponsesRequest } from '../../api/responses.ts'
import { fromValueError } from '../../api/value-error.ts'
import { ResponsesService } from '../../responses/service.ts'
import type { Services } from '../../services.ts'
import { authenticate, payerOf } from '../auth.ts'
import { jsonReader, jsonRequestBody } from '../body.ts'
import { queryEnum, queryInt } from '../query.ts'
import { answerModelCall } from './model-call.ts'

const Params = t.Object({ response_id: t.String() })

/** OpenAI's Responses API over the chat lifecycle; stored responses per organization. */
export const responseRoutes = (svc: Services) => {
  const readResponses = jsonReader(svc.config.server.maxBodyBytes, ResponsesRequest)
  const responses = new ResponsesService(svc.deps, svc.store, svc.config.responses)
  const tags = ['responses']
  return new Elysia()
    .derive(authenticate(svc))
    .post(
      '/v1/responses',
      async ({ principal, request, set, server }) => {
        const body = await readResponses(request)
        const shape = {
          operation: 'chat',
          endpoint: 'responses',
          model: body.model,
          user: body.user,
          sessionHint: body.prompt_cache_key ?? undefined,
        }
        return answerModelCall(svc, { principal, request, set, server }, body, shape, (c) => {
          const malformed = knownTypeError(body)
          if (malformed) throw fromValueError(malformed)
          return responses.create(c.payer, body, c.signal, c.requestId, c.sessionHint, c.cut, c.trace)
        })
      },
      {
        detail: {
          tags,
          summary: 'Create a response (JSON, or SSE with stream: true) on a chat model',
          requestBody: jsonRequestBody(ResponsesRequest),
        },
      },
    )
    .get(
      '/v1/responses/:response_id',
      ({ principal, params }) => responses.get(payerOf(principal).org.id, params.response_id),
      { params: Params, detail: { tags, summary: 'A stored response' } },
    )
    .get(
      '/v1/responses/:response_id/input_items',
      ({ principal, params, query }) =>
        responses.inputItems(payerOf(principal).org.id, params.response_id, {
          limit: queryInt(query.limit, 'limit', 1, 100) ?? 20,
          order: queryEnum(query.order, 'order', ['asc', 'desc'] as const) ?? 'desc',
          after: query.after,
        }),
      {
        params: Params,
        query: t.Object({
          limit: t.Optional(t.String()),
          order: t.Optional(t.String()),
          after: t.Optional(t.String()),
          include: t.Optional(t.Union([t.String(), t.Array(t.String())])),
        }),
        detail: { tags, summary: "A stored response's input items" },
      },
    )
    .delete(
      '/v1/responses/:response_id',
      ({ principal, params }) => responses.remove(payerOf(principal).org.id, params.response_id),
      { params: Params, detail: { tags, summary: 'Delete a stored response' } },
    )
}
