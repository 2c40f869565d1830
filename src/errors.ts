/**
 * The one error tree of Tropa. Code throws these; only `http/error-mapper.ts` turns them into
 * responses (OpenAI's `{"error":{message,type,param,code}}` body). No HTTP imports here.
 */
/** Client input in an error message is cut to 100 characters (an id may be megabytes long). */
export const clipped = (input: string): string => (input.length > 100 ? `${input.slice(0, 100)}…` : input)
/** Client input quoted in an error message: clipped and JSON-escaped. */
export const quoted = (input: string): string => JSON.stringify(clipped(input))

export abstract class TropaError extends Error {
  abstract readonly status: number
  /** OpenAI `error.type`. */
  abstract readonly type: string
  constructor(
    message: string,
    readonly code: string,
    readonly param: string | null = null,
  ) {
    super(message)
    this.name = new.target.name
  }
  /** Whether a client may usefully retry; the mapper sends `x-should-retry: false` when not. */
  get retryable(): boolean {
    return false
  }
}

export class InvalidRequest extends TropaError {
  readonly status: number = 400
  readonly type = 'invalid_request_error'
}
export class InvalidJson extends InvalidRequest {
  constructor(message = 'the request body is not valid JSON') {
    super(message, 'invalid_json')
  }
}
/** A config reload found the file invalid: the running config stays; every problem is listed. */
export class InvalidConfig extends InvalidRequest {
  constructor(readonly problems: readonly string[]) {
    super(
      `the config file is invalid; the running config stays:\n  - ${problems.join('\n  - ')}`,
      'invalid_config',
    )
  }
}
export class InvalidValue extends InvalidRequest {
  constructor(message: string, param: string | null) {
    super(message, 'invalid_value', param)
  }
}
export class MissingField extends InvalidRequest {
  constructor(param: string) {
    super(`missing required field: ${param}`, 'missing_field', param)
  }
}
export class ContextLengthExceeded extends InvalidRequest {
  constructor(message: string, param = 'messages') {
    super(message, 'context_length_exceeded', param)
  }
}
export class TooManyInputs extends InvalidRequest {
  constructor(max: number) {
    super(`input may hold at most ${max} items`, 'too_many_inputs', 'input')
  }
}
export class PayloadTooLarge extends InvalidRequest {
  override readonly status = 413
  constructor(maxBytes: number) {
    super(`request body is larger than ${maxBytes} bytes`, 'payload_too_large')
  }
}
export class HeadersTooLarge extends InvalidRequest {
  override readonly status = 431
  constructor(maxBytes: number) {
    super(`request headers are larger than ${maxBytes} bytes`, 'request_header_fields_too_large')
  }
}
export class UnsupportedMediaType extends InvalidRequest {
  override readonly status = 415
  constructor(contentType: string, expected = 'application/json') {
    super(`unsupported content type ${quoted(contentType)}; send ${expected}`, 'unsupported_media_type')
  }
}
export class MethodNotAllowed extends InvalidRequest {
  override readonly status = 405
  constructor(method: string, path: string) {
    super(`method ${clipped(method)} is not allowed on ${clipped(path)}`, 'method_not_allowed')
  }
}

export class AuthenticationFailed extends TropaError {
  readonly status = 401
  readonly type = 'authentication_error'
}
export const missingApiKey = () =>
  new AuthenticationFailed('no API key: send the header Authorization: Bearer <key>', 'missing_api_key')
export const invalidApiKey = () => new AuthenticationFailed('the API key is not valid', 'invalid_api_key')
export const keyRevoked = () => new AuthenticationFailed('the API key has been revoked', 'key_revoked')
export const keyDisabled = () => new AuthenticationFailed('the API key is disabled', 'key_disabled')
export const keyExpired = () => new AuthenticationFailed('the API key has expired', 'key_expired')

export const sessionRequired = () =>
  new AuthenticationFailed('not signed in to the console, or the session has expired', 'session_required')

export class QuotaExceeded extends TropaError {
  readonly status = 402
  readonly type = 'insufficient_quota'
}
export const keyLimitReached = () =>
  new QuotaExceeded('the spending limit of this API key is reached', 'key_limit_reached')
export const insufficientBalance = () =>
  new QuotaExceeded('the organization balance is too low for this request', 'insufficient_balance')
/** A period budget is spent: 402 with `x-tropa-budget-resets-at` (Unix seconds of the next period's start). */
export class BudgetExhausted extends QuotaExceeded {
  /** Unix seconds when the period ends and the budget starts again from zero. */
  readonly resetsAtSec: number
  constructor(message: string, code: string, resetsAtMs: number) {
    super(message, code)
    this.resetsAtSec = Math.ceil(resetsAtMs / 1000)
  }
}
export const keyBudgetExhausted = (resetsAtMs: number) =>
  new BudgetExhausted(
    "this API key's budget for the current period is spent; it resets at the time in x-tropa-budget-resets-at",
    'key_budget_exhausted',
    resetsAtMs,
  )
export const endUserBudgetExhausted = (resetsAtMs: number) =>
  new BudgetExhausted(
    "this end user's budget for the current period is spent; it resets at the time in x-tropa-budget-resets-at",
    'end_user_budget_exhausted',
    resetsAtMs,
  )

export class PermissionDenied extends TropaError {
  readonly status = 403
  readonly type = 'permission_error'
  constructor(message: string, code = 'permission_denied') {
    super(message, code)
  }
}

export class NotFound extends TropaError {
  readonly status = 404
  readonly type = 'not_found_error'
}
export const modelNotFound = (model: string) =>
  new NotFound(`the model ${quoted(model)} does not exist`, 'model_not_found', 'model')
export const keyNotFound = (id: string) => new NotFound(`no key ${quoted(id)}`, 'key_not_found')
export const orgNotFound = (id: string) => new NotFound(`no organization ${quoted(id)}`, 'org_not_found')
export const unknownPath = (method: string, path: string) =>
  new NotFound(`no route ${clipped(method)} ${clipped(path)}`, 'unknown_path')
export const responseNotFound = (id: string, param: string | null = null) =>
  new NotFound(`no response ${quoted(id)}`, 'response_not_found', param)

export class Conflict extends TropaError {
  readonly status = 409
  readonly type = 'conflict_error'
}

export class RateLimited extends TropaError {
  readonly status = 429
  readonly type = 'rate_limit_error'
  constructor(
    message: string,
    readonly retryAfterSec: number,
    /** `rate_limit_exceeded` (the key's), `org_rate_limited`, `model_rate_limited`, `key_concurrency_exceeded`. */
    code = 'rate_limit_exceeded',
  ) {
    super(message, code)
  }
  override get retryable() {
    return true
  }
}

/** This node cannot confirm shared state (Redis or PostgreSQL is out of reach): refusing is safer. */
export class SharedStateUnavailable extends TropaError {
  readonly status = 503
  readonly type = 'server_error'
  constructor() {
    super(
      'this router node cannot reach its shared state right now; retry shortly',
      'shared_state_unavailable',
    )
  }
  override get retryable() {
    return true
  }
}

/**
 * The client went away before its answer (it closed the connection or aborted the request):
 * nobody reads this response; 499 is the status proxies log for it.
 */
export class ClientClosedRequest extends TropaError {
  readonly status = 499
  readonly type = 'invalid_request_error'
  constructor() {
    super('the client closed the request', 'client_closed_request')
  }
}

export class InternalError extends TropaError {
  readonly status = 500
  readonly type = 'server_error'
  constructor() {
    super('internal error', 'internal_error')
  }
  override get retryable() {
    return true
  }
}

/**
 * The router is stopping (SIGTERM) and its drain deadline passed: a stream still open ends with
 * this as its error event. Another node (or this one restarted) can serve the retry.
 */
export class ServerShuttingDown extends TropaError {
  readonly status = 503
  readonly type = 'server_error'
  constructor() {
    super('the server is shutting down; retry the request', 'server_shutting_down')
  }
  override get retryable() {
    return true
  }
}

/** The data directory's disk (or quota) is full: nothing was stored; retry once space is freed. */
export class InsufficientStorage extends TropaError {
  readonly status = 507
  readonly type = 'server_error'
  constructor(what = 'the request') {
    super(`the server has no disk space left to store ${what}; retry later`, 'insufficient_storage')
  }
  override get retryable() {
    return true
  }
}

/**
 * Whether an error is the disk (or a quota) being full: ENOSPC/EDQUOT from the OS, SQLITE_FULL from
 * SQLite, 53100 (disk_full) from PostgreSQL; also when wrapped (`cause`) or sent across a thread as text.
 */
export function isDiskFull(err: unknown, depth = 0): boolean {
  if (err === null || err === undefined || depth > 4) return false
  if (typeof err === 'string') return DISK_FULL_TEXT.test(err)
  const e = err as { code?: unknown; message?: unknown; cause?: unknown }
  if (typeof e.code === 'string' && DISK_FULL_CODES.has(e.code)) return true
  if (typeof e.message === 'string' && DISK_FULL_TEXT.test(e.message)) return true
  return e.cause !== undefined && isDiskFull(e.cause, depth + 1)
}
const DISK_FULL_CODES = new Set(['ENOSPC', 'EDQUOT', 'SQLITE_FULL', '53100', 'insufficient_storage'])
const DISK_FULL_TEXT =
  /\b(ENOSPC|EDQUOT|SQLITE_FULL|InsufficientStorage)\b|database or disk is full|no space left on device/i

/** Upstream failures. `beforeFirstByte` ones let the pipeline fail over to another node. */
export class UpstreamFailed extends TropaError {
  readonly status: number = 502
  readonly type: string = 'upstream_error'
  constructor(
    message: string,
    code = 'upstream_error',
    /** The upstream's HTTP status, when it answered. */
    readonly upstreamStatus: number | null = null,
    /** What went wrong in detail, for the log only. */
    readonly detail: string | null = null,
  ) {
    super(message, code)
  }
  override get retryable() {
    return true
  }
}

/**
 * The node could not be connected to: the request never reached it, so trying another node costs
 * the fleet nothing and does not spend the retry budget (attempts stay capped per request).
 */
export class UpstreamUnreachable extends UpstreamFailed {
  constructor(node: string, detail: string | null) {
    super(`upstream node ${node} could not be reached`, 'upstream_error', null, detail)
  }
}
export class UpstreamTimeout extends UpstreamFailed {
  override readonly status = 504
  constructor(message: string) {
    super(message, 'upstream_timeout')
  }
}
export class NoUpstreamAvailable extends UpstreamFailed {
  override readonly status = 503
  override readonly type = 'server_error'
  constructor(model: string) {
    super(`no upstream node is available for ${model}`, 'no_upstream_available')
  }
}
/**
 * The upstream rejected the request itself (4xx other than 408/429): passed on, never retried
 * elsewhere. The message is the upstream's, cleaned (upstream/redact.ts); `detail`, its original,
 * is for the log only. 413 and 422 keep their status; any other 4xx is a 400.
 */
export class UpstreamRejected extends InvalidRequest {
  override readonly status: number
  constructor(
    message: string,
    upstreamStatus: number,
    param: string | null = null,
    /** The upstream's message as it sent it, for the log only. */
    readonly detail: string | null = null,
  ) {
    super(message, 'upstream_rejected', param)
    this.upstreamStatus = upstreamStatus
    this.status = upstreamStatus === 413 || upstreamStatus === 422 ? upstreamStatus : 400
  }
  upstreamStatus: number
}

/** The key's `models` do not include the model asked for. */
export const modelNotAllowed = (model: string) =>
  new PermissionDenied(`this API key may not use the model ${model}`, 'model_not_allowed')
