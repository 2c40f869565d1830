import { Elysia, type ValidationError } from 'elysia'
import { fromValueError } from '../api/value-error.ts'
import {
  BudgetExhausted,
  ClientClosedRequest,
  InsufficientStorage,
  InternalError,
  InvalidJson,
  isDiskFull,
  MethodNotAllowed,
  RateLimited,
  TropaError,
  unknownPath,
} from '../errors.ts'
import type { Log } from '../log.ts'

/** The OpenAI error body and status of any error; the only place errors become responses. */
export function errorResponse(err: TropaError, requestId: string | undefined): Response {
  const headers: Record<string, string> = { 'content-type': 'application/json' }
  if (requestId) headers['x-request-id'] = requestId
  if (!err.retryable) headers['x-should-retry'] = 'false'
  if (err instanceof RateLimited) headers['retry-after'] = String(err.retryAfterSec)
  else if (err instanceof BudgetExhausted) headers['x-tropa-budget-resets-at'] = String(err.resetsAtSec)
  return new Response(
    JSON.stringify({ error: { message: err.message, type: err.type, param: err.param, code: err.code } }),
    { status: err.status, headers },
  )
}

/** Anthropic's `error.type` for each status Tropa answers with (the status itself is kept). */
const ANTHROPIC_TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  // Anthropic documents 402 billing_error (its SDK's ErrorType lists it): a key or organization
  // out of money is that.
  402: 'billing_error',
  403: 'permission_error',
  404: 'not_found_error',
  409: 'conflict_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  500: 'api_error',
  502: 'api_error',
  503: 'overloaded_error',
  504: 'timeout_error',
}

/**
 * The same error in Anthropic's shape, for the Messages API's paths:
 * `{"type":"error","error":{"type","message"},"request_id"}` with the same status and headers
 * (other 4xx are `invalid_request_error`, other 5xx `api_error`, as Anthropic says).
 */
export function anthropicErrorResponse(err: TropaError, requestId: string | undefined): Response {
  const res = errorResponse(err, requestId)
  const type = ANTHROPIC_TYPES[err.status] ?? (err.status >= 500 ? 'api_error' : 'invalid_request_error')
  if (requestId) res.headers.set('request-id', requestId)
  return new Response(
    JSON.stringify({ type: 'error', error: { type, message: err.message }, request_id: requestId ?? null }),
    { status: err.status, headers: res.headers },
  )
}

/** The paths whose errors take Anthropic's shape (the Messages API). */
const anthropicPath = (url: string): boolean => {
  const at = url.indexOf('/', url.indexOf('//') + 2)
  if (at < 0 || !url.startsWith('/v1/messages', at)) return false
  const next = url.charCodeAt(at + 12)
  return Number.isNaN(next) || next === 47 /* / */ || next === 63 /* ? */
}

/**
 * Turns what any route throws (and Elysia's own VALIDATION, PARSE and NOT_FOUND) into our
 * errors. A wrong method on a known path is 405. Unknown errors are logged, never returned.
 */
export const errorMapper = (
  log: Log,
  allowedMethods: (path: string) => string[],
  /** Told of every error that is a full disk (they become 507 `insufficient_storage`). */
  onDiskFull: (err: unknown) => void = () => {},
  /** Told of every error response (the request's record ends with it). */
  onAnswered: (requestId: string, status: number) => void = () => {},
) =>
  new Elysia({ name: 'error-mapper' }).onError({ as: 'global' }, ({ code, error, request, set }) => {
    const requestId = set.headers['x-request-id'] as string | undefined
    let err: TropaError
    // Elysia wraps what a body parser throws (our 413 and 415 included) in a ParseError.
    const cause = (error as { cause?: unknown }).cause
    if (error instanceof TropaError) err = error
    else if (code === 'PARSE' && cause instanceof TropaError) err = cause
    else if (code === 'VALIDATION') err = fromValueError((error as ValidationError).valueError)
    else if (code === 'PARSE') err = new InvalidJson()
    else if (code === 'NOT_FOUND') {
      const path = new URL(request.url).pathname
      err =
        allowedMethods(path).length > 0
          ? new MethodNotAllowed(request.method, path)
          : unknownPath(request.method, path)
    } else if (isDiskFull(error)) {
      // A store write (SQLite's "database or disk is full", ENOSPC) failed for want of space:
      // nothing was stored, and the client may retry once space is freed.
      onDiskFull(error)
      err = new InsufficientStorage()
    } else if (
      request.signal.aborted &&
      (error === request.signal.reason || (error as Error)?.name === 'AbortError')
    ) {
      // The client left mid-request, and what was waiting on it gave up with the abort's reason
      // (any other error is still a bug, and logged below).
      err = new ClientClosedRequest()
    } else {
      log('error', 'unhandled error', {
        requestId,
        code: String(code),
        error: String((error as Error)?.stack ?? error),
      })
      err = new InternalError()
    }
    const res = (anthropicPath(request.url) ? anthropicErrorResponse : errorResponse)(err, requestId)
    if (err instanceof MethodNotAllowed)
      res.headers.set('allow', allowedMethods(new URL(request.url).pathname).join(', '))
    if (requestId) onAnswered(requestId, err.status)
    return res
  })
