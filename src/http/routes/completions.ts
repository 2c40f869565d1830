import { Elysia } from 'elysia'
import { CompletionRequest } from '../../api/completions.ts'
import { textCompletion } from '../../pipeline/completions.ts'
import type { Services } from '../../services.ts'
import { authenticate } from '../auth.ts'
import { jsonReader, jsonRequestBody } from '../body.ts'
import { answerModelCall } from './model-call.ts'

export const completionRoutes = (svc: Services) => {
  const readCompletion = jsonReader(svc.config.server.maxBodyBytes, CompletionRequest)
  return new Elysia().derive(authenticate(svc)).post(
    '/v1/completions',
    async ({ principal, request, set, server }) => {
      const body = await readCompletion(request)
      const shape = {
        operation: 'text_completion',
        endpoint: 'completions',
        model: body.model,
        user: body.user,
      }
      return answerModelCall(svc, { principal, request, set, server }, body, shape, (c) =>
        textCompletion(svc.deps, c.payer, body, c.signal, c.requestId, c.sessionHint, c.cut, c.trace),
      )
    },
    {
      detail: {
        tags: ['completions'],
        summary: 'Legacy text completion on a chat model (JSON, or SSE with stream: true)',
        requestBody: jsonRequestBody(CompletionRequest),
      },
    },
  )
}
