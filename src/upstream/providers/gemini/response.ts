import { UpstreamFailed } from '../../../errors.ts'
import { SIGNATURE_MARK } from './request.ts'

// Gemini's GenerateContentResponse (whole, or one SSE chunk of a stream) read back into OpenAI's
// chat.completion / chat.completion.chunk, and batchEmbedContents' reply into an embeddings list.

type Json = Record<string, unknown>

interface Part {
  text?: unknown
  thought?: unknown
  thoughtSignature?: unknown
  functionCall?: { id?: unknown; name?: unknown; args?: unknown }
}
interface Candidate {
  content?: { parts?: unknown }
  finishReason?: unknown
}
export interface GenerateContentResponse {
  candidates?: unknown
  promptFeedback?: { blockReason?: unknown }
  usageMetadata?: unknown
  modelVersion?: unknown
  responseId?: unknown
  error?: unknown
}

export interface ToolCall {
  id: string
  type: 'function'
  function: { name: string; arguments: string }
}

const FILTERED = new Set([
  'SAFETY',
  'RECITATION',
  'BLOCKLIST',
  'PROHIBITED_CONTENT',
  'SPII',
  'IMAGE_SAFETY',
  'IMAGE_PROHIBITED_CONTENT',
  'IMAGE_RECITATION',
])

/** OpenAI's finish_reason for Gemini's finishReason (tool calls win over STOP). */
export function finishReason(reason: unknown, calledTools: boolean): string {
  if (reason === 'MAX_TOKENS') return 'length'
  if (typeof reason === 'string' && FILTERED.has(reason)) return 'content_filter'
  return calledTools ? 'tool_calls' : 'stop'
}

/** OpenAI usage for Gemini's usageMetadata; undefined when it has no counts (Tropa counts then). */
export function usageOf(meta: unknown): Json | undefined {
  if (!meta || typeof meta !== 'object') return undefined
  const m = meta as Record<string, unknown>
  const n = (x: unknown) => (typeof x === 'number' ? x : 0)
  if (typeof m.promptTokenCount !== 'number') return undefined
  const prompt = m.promptTokenCount + n(m.toolUsePromptTokenCount)
  // Thinking is generated and billed as output.
  const completion = n(m.candidatesTokenCount) + n(m.thoughtsTokenCount)
  const usage: Json = {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
  }
  if (typeof m.cachedContentTokenCount === 'number')
    usage.prompt_tokens_details = { cached_tokens: m.cachedContentTokenCount }
  if (typeof m.thoughtsTokenCount === 'number')
    usage.completion_tokens_details = { reasoning_tokens: m.thoughtsTokenCount }
  return usage
}

export function newCallId(signature?: unknown): string {
  const id = `call_${crypto.randomUUID().replaceAll('-', '').slice(0, 24)}`
  return typeof signature === 'string' && signature.length > 0 ? `${id}${SIGNATURE_MARK}${signature}` : id
}

/** The text and tool calls of a candidate's parts (thought summaries are not the answer). */
export function readParts(parts: unknown): { text: string; calls: ToolCall[] } {
  let text = ''
  const calls: ToolCall[] = []
  if (!Array.isArray(parts)) return { text, calls }
  for (const p of parts as Part[]) {
    if (!p || typeof p !== 'object' || p.thought === true) continue
    if (typeof p.text === 'string') text += p.text
    const fc = p.functionCall
    if (fc && typeof fc.name === 'string')
      calls.push({
        id: newCallId(p.thoughtSignature),
        type: 'function',
        function: { name: fc.name, arguments: JSON.stringify(fc.args ?? {}) },
      })
  }
  return { text, calls }
}

function firstCandidate(r: GenerateContentResponse): Candidate | undefined {
  return Array.isArray(r.candidates) ? (r.candidates[0] as Candidate | undefined) : undefined
}

/** A whole generateContent reply as OpenAI's chat.completion. */
export function toChatCompletion(text: string, model: string): string {
  let r: GenerateContentResponse
  try {
    r = JSON.parse(text) as GenerateContentResponse
  } catch {
    throw new UpstreamFailed('the Gemini node sent a malformed response')
  }
  if (!r || typeof r !== 'object') throw new UpstreamFailed('the Gemini node sent a malformed response')
  const c = firstCandidate(r)
  const { text: content, calls } = readParts(c?.content?.parts)
  // No candidate at all: the prompt itself was blocked (promptFeedback.blockReason).
  const finish = c ? finishReason(c.finishReason, calls.length > 0) : 'content_filter'
  const message: Json = { role: 'assistant', content: calls.length > 0 && content === '' ? null : content }
  if (calls.length > 0) message.tool_calls = calls
  const out: Json = {
    id: `chatcmpl-${typeof r.responseId === 'string' ? r.responseId : crypto.randomUUID()}`,
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model: typeof r.modelVersion === 'string' ? r.modelVersion : model,
    choices: [{ index: 0, message, logprobs: null, finish_reason: finish }],
  }
  const usage = usageOf(r.usageMetadata)
  if (usage) out.usage = usage
  return JSON.stringify(out)
}

/** A bounded SSE line buffer: an event longer than this fails the stream. */
export const MAX_EVENT_BYTES = 1024 * 1024
const encoder = new TextEncoder()

/**
 * Gemini's SSE stream (`data: {GenerateContentResponse}` events) as OpenAI's chunk stream: one
 * chunk per Gemini chunk, a finish chunk, the final usage chunk (from the last usageMetadata) and
 * [DONE]. Event by event, never buffering more than one event (MAX_EVENT_BYTES). A stream that
 * ends before a finishReason is a broken stream (an error), not a complete answer.
 */
export function translateStream(
  upstream: ReadableStream<Uint8Array>,
  model: string,
): ReadableStream<Uint8Array> {
  const reader = upstream.getReader()
  const decoder = new TextDecoder()
  const id = `chatcmpl-${crypto.randomUUID()}`
  const created = Math.floor(Date.now() / 1000)
  const head = `{"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":`
  let buffer = ''
  let usage: Json | undefined
  let finish: string | undefined
  let toolIndex = 0
  let first = true
  let done = false

  const chunk = (delta: Json, reason: string | null) =>
    `data: ${head}[{"index":0,"delta":${JSON.stringify(delta)},"logprobs":null,"finish_reason":${reason === null ? 'null' : JSON.stringify(reason)}}]}\n\n`

  const event = (payload: string): string => {
    let r: GenerateContentResponse
    try {
      r = JSON.parse(payload) as GenerateContentResponse
    } catch {
      throw new UpstreamFailed('the Gemini node sent a malformed stream event')
    }
    if (!r || typeof r !== 'object') throw new UpstreamFailed('the Gemini node sent a malformed stream event')
    if (r.error !== undefined) {
      // An error mid-stream: as an OpenAI error event, which the relay reports.
      const e = r.error as { message?: unknown; status?: unknown }
      const message = typeof e?.message === 'string' ? e.message : 'the upstream stream failed'
      return `data: ${JSON.stringify({ error: { message, type: 'upstream_error', code: typeof e?.status === 'string' ? e.status : null } })}\n\n`
    }
    const u = usageOf(r?.usageMetadata)
    if (u) usage = u
    const c = firstCandidate(r)
    if (!c) {
      if (r?.promptFeedback?.blockReason !== undefined && finish === undefined) {
        finish = 'content_filter'
        return chunk(first ? { role: 'assistant', content: '' } : {}, finish)
      }
      return ''
    }
    const { text, calls } = readParts(c.content?.parts)
    let out = ''
    if (first || text.length > 0 || calls.length > 0) {
      const delta: Json = first ? { role: 'assistant' } : {}
      if (text.length > 0 || calls.length === 0) delta.content = text
      if (calls.length > 0) delta.tool_calls = calls.map((call) => ({ index: toolIndex++, ...call }))
      out += chunk(delta, null)
      first = false
    }
    if (c.finishReason !== undefined && c.finishReason !== null && finish === undefined) {
      finish = finishReason(c.finishReason, toolIndex > 0)
      out += chunk({}, finish)
    }
    return out
  }

  const drain = (final: boolean): string => {
    if (buffer.includes('\r')) buffer = buffer.replaceAll('\r\n', '\n')
    let out = ''
    let start = 0
    for (;;) {
      let end = buffer.indexOf('\n\n', start)
      if (end < 0 && final && start < buffer.length && buffer.trim().length > 0) end = buffer.length
      if (end < 0) break
      const text = buffer.slice(start, end)
      start = Math.min(buffer.length, end + 2)
      for (const line of text.split('\n'))
        if (line.startsWith('data:')) {
          const payload = line.slice(5).trim()
          if (payload.length > 0) out += event(payload)
        }
    }
    buffer = buffer.slice(start)
    if (buffer.length > MAX_EVENT_BYTES)
      throw new UpstreamFailed('the Gemini node sent an oversized stream event')
    return out
  }

  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (done) return
      try {
        for (;;) {
          const { done: ended, value } = await reader.read()
          if (ended) {
            buffer += decoder.decode()
            let out = drain(true)
            done = true
            if (finish === undefined)
              throw new UpstreamFailed('the Gemini node ended its stream before it finished')
            if (usage) out += `data: ${head}[],"usage":${JSON.stringify(usage)}}\n\n`
            out += 'data: [DONE]\n\n'
            controller.enqueue(encoder.encode(out))
            controller.close()
            return
          }
          buffer += decoder.decode(value, { stream: true })
          const out = drain(false)
          if (out.length > 0) {
            controller.enqueue(encoder.encode(out))
            return
          }
        }
      } catch (err) {
        done = true
        reader.cancel(err).catch(() => {})
        controller.error(err)
      }
    },
    cancel(reason) {
      done = true
      return reader.cancel(reason).catch(() => {})
    },
  })
}

/** batchEmbedContents' reply as OpenAI's embeddings list, as floats or base64 float32. */
export function toEmbeddingList(text: string, model: string, base64: boolean): string {
  let r: { embeddings?: unknown; usageMetadata?: unknown }
  try {
    r = JSON.parse(text) as typeof r
  } catch {
    throw new UpstreamFailed('the Gemini node sent a malformed embeddings response')
  }
  if (!r || !Array.isArray(r.embeddings))
    throw new UpstreamFailed('the Gemini node sent a malformed embeddings response')
  const data = r.embeddings.map((e, index) => {
    const values = (e as { values?: unknown })?.values
    if (!Array.isArray(values) || !values.every((v) => typeof v === 'number'))
      throw new UpstreamFailed('the Gemini node sent an embedding without values')
    const embedding = base64
      ? Buffer.from(new Float32Array(values as number[]).buffer).toString('base64')
      : (values as number[])
    return { object: 'embedding', index, embedding }
  })
  const out: Json = { object: 'list', data, model }
  // Gemini's batchEmbedContents has no token counts as documented; if it sends some, they bill.
  const p = (r.usageMetadata as { promptTokenCount?: unknown } | undefined)?.promptTokenCount
  if (typeof p === 'number') out.usage = { prompt_tokens: p, total_tokens: p }
  return JSON.stringify(out)
}

/** Reads a whole body, failing past `cap` bytes (a reply bigger than any answer is a broken node). */
export async function readAll(body: ReadableStream<Uint8Array> | null, cap: number): Promise<string> {
  if (!body) return ''
  const reader = body.getReader()
  const decoder = new TextDecoder()
  let text = ''
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) return text + decoder.decode()
    size += value.byteLength
    if (size > cap) {
      await reader.cancel().catch(() => {})
      throw new UpstreamFailed('the Gemini node sent an oversized response')
    }
    text += decoder.decode(value, { stream: true })
  }
}

/** A Response whose body is `produce`'s text, computed when the body is first read. */
export function lazyJson(produce: () => Promise<string>, onCancel: (reason: unknown) => void): Response {
  let started = false
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (started) return
      started = true
      try {
        controller.enqueue(encoder.encode(await produce()))
        controller.close()
      } catch (err) {
        controller.error(err)
      }
    },
    cancel(reason) {
      onCancel(reason)
    },
  })
  return new Response(body, { status: 200, headers: { 'content-type': 'application/json' } })
}
