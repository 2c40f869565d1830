import type { TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { Elysia, t } from 'elysia'
import { ITEM_SCHEMAS, PART_SCHEMAS, ResponsesRequest, TOOL_SCHEMAS } from '../../api/responses.ts'
import { ResponsesService } from '../../responses/service.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst, payerOf } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'
import { fromValueError } from '../value-error.ts'

const Params = t.Object({ response_id: t.String() })

/** OpenAI's Responses API over the chat lifecycle; stored responses per organization. */
export const responseRoutes = (svc: Services) => {
  const responses = new ResponsesService(svc.deps, svc.store)
  const tags = ['responses']
  return new Elysia()
    .derive(authenticate(svc))
    .post(
      '/v1/responses',
      ({ principal, body, request, set, server }) => {
        const payer = payerOf(principal)
        checkKnownTypes(body as ResponsesRequest)
        return responses.create(
          payer,
          body as ResponsesRequest,
          request.signal,
          set.headers['x-request-id'] as string,
          request.headers.get(svc.config.routing.sessionHeader) ?? undefined,
          () => server?.timeout(request, 1),
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
    .delete(
      '/v1/responses/:response_id',
      ({ principal, params }) => responses.remove(payerOf(principal).org.id, params.response_id),
      { params: Params, detail: { tags, summary: 'Delete a stored response' } },
    )
}

type Checker = ReturnType<typeof TypeCompiler.Compile>
const compiled = (schemas: Record<string, TSchema>) =>
  new Map<string, Checker>(Object.entries(schemas).map(([k, v]) => [k, TypeCompiler.Compile(v)]))
const ITEMS = compiled(ITEM_SCHEMAS)
const PARTS = compiled(PART_SCHEMAS)
const TOOLS = compiled(TOOL_SCHEMAS)

function checkAs(check: Checker | undefined, value: unknown, path: string): void {
  if (!check || check.Check(value)) return
  const e = check.Errors(value).First()
  throw fromValueError(e && { ...e, path: `${path}${e.path}` })
}

/**
 * Items, parts and tools of a known type against that type's schema (the request schema lets
 * any type through, so that a malformed known one is named precisely and an unknown one is
 * refused by name when translated).
 */
function checkKnownTypes(body: ResponsesRequest): void {
  for (const [i, tool] of (body.tools ?? []).entries()) checkAs(TOOLS.get(tool.type), tool, `/tools/${i}`)
  if (typeof body.input === 'string') return
  for (const [i, item] of body.input.entries()) {
    const type = item.type ?? 'message'
    checkAs(ITEMS.get(type), item, `/input/${i}`)
    const field = type === 'message' ? 'content' : type === 'function_call_output' ? 'output' : undefined
    const parts = field && (item as Record<string, unknown>)[field]
    if (Array.isArray(parts))
      for (const [j, p] of (parts as { type: string }[]).entries())
        checkAs(PARTS.get(p.type), p, `/input/${i}/${field}/${j}`)
  }
}
