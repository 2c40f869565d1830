import { type ValueError, ValueErrorType } from '@sinclair/typebox/value'
import { InvalidValue, MissingField, type TropaError } from '../errors.ts'

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
  // Finding the first bad element of a long array walks it again, checking each element
  // against the schema (a second on a 32 MiB body): a long array gets the union's own message.
  if (Array.isArray(e.value) && e.value.length > LONG_ARRAY) return e
  let best: ValueError | undefined
  for (const branch of e.errors) {
    const subs = firstErrors(branch)
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

/**
 * A branch's first errors. Only a few are looked at: a branch's errors are produced lazily and
 * there is one per failing element below it, so reading them all would make the 400 for an array
 * of 100,000 bad content parts cost a second of CPU (nested unions multiply it).
 */
const BRANCH_ERRORS = 16
const LONG_ARRAY = 1024
function firstErrors(branch: Iterable<ValueError>): ValueError[] {
  const out: ValueError[] = []
  for (const sub of branch) {
    out.push(sub)
    if (out.length >= BRANCH_ERRORS) break
  }
  return out
}

/** What one schema accepts, in words: "an integer", "null", "\"auto\"". */
function kindOf(schema: { type?: unknown; const?: unknown; anyOf?: unknown[] }): string {
  if (schema.const !== undefined) return JSON.stringify(schema.const)
  switch (schema.type) {
    case 'integer':
      return 'an integer'
    case 'number':
      return 'a number'
    case 'string':
      return 'a string'
    case 'boolean':
      return 'a boolean'
    case 'null':
      return 'null'
    case 'array':
      return 'an array'
    case 'object':
      return 'an object'
  }
  return 'a valid value'
}

/**
 * "must be one of a, b, c" for a union of literals, "must be an integer or null" for another
 * union none of whose branches came close, else TypeBox's message.
 */
function describe(e: ValueError): string {
  const options = (e.schema as { anyOf?: { const?: unknown }[] }).anyOf
  if (e.type === ValueErrorType.Union && options) {
    if (options.every((o) => o.const !== undefined))
      return `must be one of ${options.map((o) => JSON.stringify(o.const)).join(', ')}`
    const kinds = [...new Set(options.map(kindOf))]
    const last = kinds.pop()
    return `must be ${kinds.length > 0 ? `${kinds.join(', ')} or ${last}` : last}`
  }
  return e.message.toLowerCase()
}

/** A TypeBox error as the 400 a client sees: the param in OpenAI's notation and a plain message. */
export function fromValueError(error: ValueError | undefined): TropaError {
  const first = error ? mostSpecific(error) : undefined
  if (!first) return new InvalidValue('the request body is not valid', null)
  const param = paramOf(first.path)
  if (first.type === ValueErrorType.ObjectRequiredProperty) return new MissingField(param)
  if (param === '') return new InvalidValue(`the request body must be a JSON object`, null)
  return new InvalidValue(`${param}: ${describe(first)}`, param)
}
