import type { Static, TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { fromValueError } from '../api/value-error.ts'
import { InvalidJson, InvalidValue, PayloadTooLarge, UnsupportedMediaType } from '../errors.ts'
import { MAX_JSON_DEPTH, nestedDeeperThan } from '../json-depth.ts'

/**
 * The body of every JSON route, checked by Tropa alone (never by the framework's validator,
 * whose error message prints the whole body): authentication (401 before reading), content type
 * (415), size (413), nesting depth and JSON syntax (400), then the route's schema (400 naming
 * the first failing param). Every step is linear in the body's size and bounded by `maxBytes`.
 */
export function jsonBody<S extends TSchema>(
  maxBytes: number,
  schema: S,
  authenticate?: (request: Request) => Promise<void>,
) {
  const read = jsonReader(maxBytes, schema)
  return async ({ request }: { request: Request }): Promise<Static<S>> => {
    // A caller without a valid key gets its 401 before Tropa reads (up to maxBytes of) its body.
    await authenticate?.(request)
    return read(request)
  }
}

/**
 * A model route's body, read and checked by its handler: the route's `authenticate` (derive) has
 * run by then, so a caller without a valid key still gets its 401 before any of the body is read.
 * Not an Elysia parse hook: for a route with one, Elysia's handler tests `request.body`, and that
 * makes Bun create a web stream and its source for the request's body, which then live as long
 * as the request, a streamed answer's whole life (about half a kilobyte each). Nor is a principal
 * kept per request to hand from the parser to derive.
 */
export function jsonReader<S extends TSchema>(
  maxBytes: number,
  schema: S,
): (request: Request) => Promise<Static<S>> {
  const check = TypeCompiler.Compile(schema)
  return async (request) => {
    const value = await readJson(request, maxBytes)
    if (!check.Check(value)) throw fromValueError(check.Errors(value).First())
    return value
  }
}

/** The request's JSON value: content type, size, depth and syntax checked, nothing else. */
export async function readJson(request: Request, maxBytes: number): Promise<unknown> {
  const type = request.headers.get('content-type')
  if (type !== null && !/^application\/([\w.+-]*\+)?json\s*(;|$)/i.test(type))
    throw new UnsupportedMediaType(type.slice(0, 100))
  const text = await readCapped(request, maxBytes)
  if (text.trim().length === 0) throw new InvalidJson('the request body is empty; send a JSON object')
  if (nestedDeeperThan(text, MAX_JSON_DEPTH))
    throw new InvalidValue(
      `the request body nests arrays or objects deeper than ${MAX_JSON_DEPTH} levels`,
      null,
    )
  try {
    return JSON.parse(text)
  } catch {
    throw new InvalidJson()
  }
}

/** The OpenAPI `requestBody` of a route whose body `jsonBody` checks (for /docs/json). */
export const jsonRequestBody = (schema: TSchema) => ({
  required: true,
  content: { 'application/json': { schema } },
})

function readCapped(request: Request, maxBytes: number): Promise<string> {
  const declared = request.headers.get('content-length')
  if (declared === null) return readCounting(request, maxBytes)
  if (Number(declared) > maxBytes) return Promise.reject(new PayloadTooLarge(maxBytes))
  return request.text()
}

/** A chunked upload: counted as it arrives, so an endless body cannot fill memory. */
async function readCounting(request: Request, maxBytes: number): Promise<string> {
  const body = request.body
  if (!body) return ''
  const chunks: Uint8Array[] = []
  let size = 0
  for await (const chunk of body) {
    size += chunk.byteLength
    if (size > maxBytes) throw new PayloadTooLarge(maxBytes)
    chunks.push(chunk)
  }
  return Buffer.concat(chunks).toString('utf8')
}
