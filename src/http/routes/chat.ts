import { Elysia } from 'elysia'
import { ChatRequest } from '../../api/chat.ts'
import { chatCompletion } from '../../pipeline/chat.ts'
import type { Services } from '../../services.ts'
import { authenticate, authenticateFirst } from '../auth.ts'
import { jsonBody, jsonRequestBody } from '../body.ts'
import { answerModelCall } from './model-call.ts'

export const chatRoutes = (svc: Services) =>
  new Elysia().derive(authenticate(svc)).post(
    '/v1/chat/completions',
    ({ body: raw, principal, request, set, server }) => {
      const body = raw as ChatRequest
      const shape = { operation: 'chat', endpoint: 'chat', model: body.model, user: body.user }
      return answerModelCall(svc, { principal, request, set, server }, body, shape, (c) =>
        chatCompletion(svc.deps, c.payer, body, c.signal, c.requestId, c.sessionHint, c.cut, c.trace),
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
