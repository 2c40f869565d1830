import { UpstreamFailed } from '../../errors.ts'

/** The longest line a translated stream may hold while waiting for its end (1 MiB of text). */
export const MAX_LINE_CHARS = 1 << 20

/**
 * Splits a byte stream into its text lines (LF or CRLF), one string each, empty lines included.
 * A line longer than `maxChars` fails the stream (UpstreamFailed): nothing buffers without bound.
 * The text after the last newline is emitted at the end.
 */
export function lineSplitter(node: string, maxChars = MAX_LINE_CHARS): TransformStream<Uint8Array, string> {
  const decoder = new TextDecoder()
  let pending = ''
  const push = (text: string, controller: TransformStreamDefaultController<string>) => {
    let start = 0
    for (;;) {
      const nl = text.indexOf('\n', start)
      if (nl < 0) break
      let line = pending + text.slice(start, nl)
      pending = ''
      if (line.endsWith('\r')) line = line.slice(0, -1)
      controller.enqueue(line)
      start = nl + 1
    }
    pending += text.slice(start)
    if (pending.length > maxChars) {
      pending = ''
      throw new UpstreamFailed(`${node} sent a stream line over ${maxChars} characters`, 'upstream_error')
    }
  }
  return new TransformStream<Uint8Array, string>({
    transform(chunk, controller) {
      push(decoder.decode(chunk, { stream: true }), controller)
    },
    flush(controller) {
      push(decoder.decode(), controller)
      if (pending) controller.enqueue(pending)
      pending = ''
    },
  })
}

const encoder = new TextEncoder()

/** An OpenAI SSE event's bytes for one JSON payload. */
export const sseEvent = (payload: unknown): Uint8Array =>
  encoder.encode(`data: ${JSON.stringify(payload)}\n\n`)
export const SSE_DONE = encoder.encode('data: [DONE]\n\n')

/** A short random id suffix (completion and tool call ids of translated replies). */
export const randomId = (): string => crypto.randomUUID().replaceAll('-', '').slice(0, 24)

/** Float vectors as OpenAI's base64 encoding_format: little-endian float32 bytes. */
export function floatsToBase64(v: readonly number[]): string {
  const f = new Float32Array(v)
  return Buffer.from(f.buffer, f.byteOffset, f.byteLength).toString('base64')
}

/**
 * A 200 JSON Response whose body is made from the upstream's reply as it is read: the caller's
 * body deadline (readBody) covers the read, and its abort stops it. `make` may throw (a broken
 * reply): the body read fails, which the pipeline takes as the node's failure.
 */
export function translatedJson(make: () => Promise<unknown>): Response {
  let started = false
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (started) return
      started = true
      try {
        controller.enqueue(encoder.encode(JSON.stringify(await make())))
        controller.close()
      } catch (err) {
        controller.error(err)
      }
    },
  })
  return new Response(body, { status: 200, headers: { 'content-type': 'application/json' } })
}
