import { InvalidJson, PayloadTooLarge, UnsupportedMediaType } from '../errors.ts'

/**
 * The body parser of every JSON route: content type (415), size (413) and JSON syntax (400)
 * fail with our errors instead of Elysia's.
 */
export function jsonBody(maxBytes: number, authenticate?: (request: Request) => Promise<void>) {
  return async ({ request }: { request: Request }): Promise<unknown> => {
    // A caller without a valid key gets its 401 before Tropa reads (up to maxBytes of) its body.
    await authenticate?.(request)
    const type = request.headers.get('content-type')
    if (type !== null && !/^application\/([\w.+-]*\+)?json\s*(;|$)/i.test(type))
      throw new UnsupportedMediaType(type)
    const text = await readCapped(request, maxBytes)
    if (text.trim().length === 0) throw new InvalidJson('the request body is empty; send a JSON object')
    try {
      return JSON.parse(text)
    } catch {
      throw new InvalidJson()
    }
  }
}

async function readCapped(request: Request, maxBytes: number): Promise<string> {
  const declared = request.headers.get('content-length')
  if (declared !== null) {
    if (Number(declared) > maxBytes) throw new PayloadTooLarge(maxBytes)
    return request.text()
  }
  // Chunked upload: count as it arrives, so an endless body cannot fill memory.
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
