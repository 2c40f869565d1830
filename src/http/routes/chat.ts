import { Elysia } from 'elysia'
import { ChatRequest } from '../../api/chat.ts'
import { chatCompletion } from '../../pipeline/chat.ts'
import type { Services } from '../../services.ts'
import { authenticate } from '../auth.ts'
import { jsonReader, jsonRequestBody } from '../body.ts'
import { answerModelCall } from './model-call.ts'

export const chatRoutes = (svc: Services) => {
  const readChat = jsonReader(svc.config.server.maxBodyBytes, ChatRequest)
  return new Elysia().derive(authenticate(svc)).post(
    '/v1/chat/completions',
    async ({ principal, request, set, server }) => {
      const body = await readChat(request)
      const shape = { operation: 'chat', endpoint: 'chat', model: body.model, user: body.user }
      return answerModelCall(svc, { principal, request, set, server }, body, shape, (c) =>
        chatCompletion(svc.deps, c.payer, body, c.signal, c.requestId, c.sessionHint, c.cut, c.trace),
      )
    },
    {
      detail: {
        tags: ['chat'],
        summary: 'Chat completion (JSON, or SSE with stream: true)',
        requestBody: jsonRequestBody(ChatRequest),
      },
    },
  )
}
