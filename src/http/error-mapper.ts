import { type ValueError, ValueErrorType } from '@sinclair/typebox/value'
import { Elysia, type ValidationError } from 'elysia'
import {
  InternalError,
  InvalidJson,
  InvalidValue,
  MethodNotAllowed,
  MissingField,
  RateLimited,
  TropaError,
  unknownPath,
} from '../errors.ts'
import type { Log } from '../services.ts'

/** The OpenAI error body and status of any error; the only place errors become responses. */
export function errorResponse(err: TropaError, requestId: string | undefined): Response {
  const headers: Record<string, string> = { 'content-type': 'application/json' }
  if (requestId) headers['x-request-id'] = requestId
  if (!err.retryable) headers['x-should-retry'] = 'false'
  if (err instanceof RateLimited) headers['retry-after'] = String(err.retryAfterSec)
  return new Response(
    JSON.stringify({ error: { message: err.message, type: err.type, param: err.param, code: err.code } }),
    { status: err.status, headers },
  )
}

/** `/messages/0/role` -> `messages[0].role`, as OpenAI names params. */
function paramOf(path: string): string {
  return path
    .split('/')
    .filter(Boolean)
    .map((seg, i) => (/^\d+$/.test(seg) ? `[${seg}]` : i === 0 ? seg : `.${seg}`))
    .join('')
}

/**
 * A union's own error only says "expected union value"; the most telling error is inside a
 * branch that matched the type but broke a constraint (`temperature: 3` fails `maximum`, not
 * `null`). Pick the deepest such error.
 */
function mostSpecific(e: ValueError): ValueError {
  if (e.type !== ValueErrorType.Union || e.errors.length === 0) return e
  let best: ValueError | undefined
  for (const branch of e.errors) {
    const subs = [...branch]
    // A branch whose discriminator (`type: "text"`, say) does not match is not the one meant.
    if (subs.some((s) => s.type === ValueErrorType.Literal)) continue
    for (const sub of subs) {
      const s = mostSpecific(sub)
      const mismatch = /^Expected (string|number|integer|boolean|null|object|array|union value)$/.test(
        s.message,
      )
      if (!mismatch && (!best || s.path.length > best.path.length)) best = s
    }
  }
  return best ?? e
}

/** "one of a, b, c" for a union of literals, else TypeBox's message. */
function describe(e: ValueError): string {
  const options = (e.schema as { anyOf?: { const?: unknown }[] }).anyOf
  if (e.type === ValueErrorType.Union && options?.every((o) => o.const !== undefined))
    return `must be one of ${options.map((o) => JSON.stringify(o.const)).join(', ')}`
  return e.message.toLowerCase()
}

function fromValidation(err: ValidationError): TropaError {
  const first = err.valueError ? mostSpecific(err.valueError) : undefined
  if (!first) return new InvalidValue('the request body is not valid', null)
  const param = paramOf(first.path)
  if (first.type === ValueErrorType.ObjectRequiredProperty) return new MissingField(param)
  if (param === '') return new InvalidValue(`the request body must be a JSON object`, null)
  return new InvalidValue(`${param}: ${describe(first)}`, param)
}

/**
 * Turns what any route throws (and Elysia's own VALIDATION, PARSE and NOT_FOUND) into our
 * errors. A wrong method on a known path is 405. Unknown errors are logged, never returned.
 */
export const errorMapper = (log: Log, allowedMethods: (path: string) => string[]) =>
  new Elysia({ name: 'error-mapper' }).onError({ as: 'global' }, ({ code, error, request, set }) => {
    const requestId = set.headers['x-request-id'] as string | undefined
    let err: TropaError
    // Elysia wraps what a body parser throws (our 413 and 415 included) in a ParseError.
    const cause = (error as { cause?: unknown }).cause
    if (error instanceof TropaError) err = error
    else if (code === 'PARSE' && cause instanceof TropaError) err = cause
    else if (code === 'VALIDATION') err = fromValidation(error as ValidationError)
    else if (code === 'PARSE') err = new InvalidJson()
    else if (code === 'NOT_FOUND') {
      const path = new URL(request.url).pathname
      err =
        allowedMethods(path).length > 0
          ? new MethodNotAllowed(request.method, path)
          : unknownPath(request.method, path)
    } else {
      log('error', 'unhandled error', {
        requestId,
        code: String(code),
        error: String((error as Error)?.stack ?? error),
      })
      err = new InternalError()
    }
    const res = errorResponse(err, requestId)
    if (err instanceof MethodNotAllowed)
      res.headers.set('allow', allowedMethods(new URL(request.url).pathname).join(', '))
    return res
  })
