import { Elysia, t } from 'elysia'
import { knownTypeError, ResponsesRequest } from '../../api/responses.ts'
import { fromValueError } from '../../api/value-error.ts'
import { ResponsesService } from '../../responses/service.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst, payerOf } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'
import { queryEnum, queryInt } from '../query.ts'

const Params = t.Object({ response_id: t.String() })

/** OpenAI's Responses API over the chat lifecycle; stored responses per organization. */
export const responseRoutes = (svc: Services) => {
  const responses = new ResponsesService(svc.deps, svc.store, svc.config.responses)
  const tags = ['responses']
  return new Elysia()
    .derive(authenticate(svc))
    .post(
      '/v1/responses',
      ({ principal, body, request, set, server }) => {
        const payer = payerOf(principal, request.headers, { user: (body as ResponsesRequest).user })
        const malformed = knownTypeError(body as ResponsesRequest)
        if (malformed) throw fromValueError(malformed)
        const id = set.headers['x-request-id'] as string
        return svc.telemetry.answered(
          id,
          responses.create(
            payer,
            body as ResponsesRequest,
            request.signal,
            id,
            request.headers.get(svc.config.routing.sessionHeader) ??
              (body as ResponsesRequest).prompt_cache_key ??
              undefined,
            () => server?.timeout(request, 1),
          ),
          body,
        )
      },
      {
        parse: jsonBody(svc.config.server.maxBodyBytes, ResponsesRequest, authenticateFirst(svc)),
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
