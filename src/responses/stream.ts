import type { Usage } from '../upstream/sse.ts'
import {
  type FunctionCallOutput,
  messageOutput,
  newCallItemId,
  newMessageId,
  type OutputItem,
  type ResponseHead,
  type ResponseObject,
  responseObject,
  responsesUsage,
  statusOf,
} from './translate.ts'

/** One chat SSE event of the relay is at most this big; past it the stream fails (bounded buffer). */
export const MAX_EVENT_CHARS = 1024 * 1024
/** Generated text and arguments kept for the final events and the stored response, at most. */
export const MAX_OUTPUT_CHARS = 16 * 1024 * 1024

interface OpenItem {
  index: number
  item: OutputItem
  /** For a function call: the chat tool call's index. */
  chatIndex?: number
}

/**
 * Chat completion chunks (Tropa's relayed SSE) -> the Responses API's stream events, one chunk
 * at a time: the events a chunk makes are returned at once, nothing is held but the line being
 * parsed and the output so far (needed for the .done events and the stored response).
 */
export class ResponsesStreamTranslator {
  private seq = 0
  private buffer = ''
  private readonly decoder = new TextDecoder()
  private readonly output: OutputItem[] = []
  private current: OpenItem | undefined
  private readonly calls = new Map<number, OpenItem>()
  private outputChars = 0
  private finish: string | null = null
  usage: Usage | undefined
  sawDone = false
  /** Set when the stream failed (an error event, a broken upstream, a limit): the failure's message. */
  failure: { code: string; message: string } | undefined

  constructor(private readonly head: ResponseHead) {}

  private event(type: string, payload: Record<string, unknown>): string {
    return `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: this.seq++, ...payload })}\n\n`
  }

  /** response.created and response.in_progress. */
  start(): string {
    const r = responseObject(this.head, 'in_progress', [], null)
    return (
      this.event('response.created', { response: r }) + this.event('response.in_progress', { response: r })
    )
  }

  /** Feeds relayed bytes; returns the events to send now. */
  push(chunk: Uint8Array): string {
    this.buffer += this.decoder.decode(chunk, { stream: true })
    if (this.buffer.includes('\r')) this.buffer = this.buffer.replaceAll('\r\n', '\n')
    let out = ''
    let start = 0
    for (;;) {
      if (this.failure || this.sawDone) break
      const end = this.buffer.indexOf('\n\n', start)
      if (end < 0) break
      out += this.chatEvent(this.buffer.slice(start, end))
      start = end + 2
    }
    this.buffer = start > 0 ? this.buffer.slice(start) : this.buffer
    if (!this.failure && this.buffer.length > MAX_EVENT_CHARS)
      out += this.fail('server_error', `an upstream event is larger than ${MAX_EVENT_CHARS} characters`)
    return out
  }

  private chatEvent(text: string): string {
    // Chat's keep-alive comment (no first token yet) goes on to the client as it is.
    if (text.startsWith(':')) return `${text}\n\n`
    let data = ''
    for (const line of text.split('\n'))
      if (line.startsWith('data:')) data += line.slice(line.charCodeAt(5) === 32 ? 6 : 5)
    if (data.length === 0) return ''
    if (data.trim() === '[DONE]') {
      this.sawDone = true
      return ''
    }
    let chunk: {
      error?: { message?: unknown; code?: unknown }
      usage?: Usage | null
      choices?: {
        delta?: {
          content?: unknown
          tool_calls?: { index?: unknown; id?: unknown; function?: { name?: unknown; arguments?: unknown } }[]
        }
        finish_reason?: unknown
      }[]
    }
    try {
      chunk = JSON.parse(data)
    } catch {
      return this.fail('server_error', 'the upstream sent an event that is not JSON')
    }
    if (!chunk || typeof chunk !== 'object') return ''
    if (chunk.error) {
      const e = chunk.error
      return this.fail(
        typeof e.code === 'string' ? e.code : 'server_error',
        typeof e.message === 'string' ? e.message : 'the upstream failed mid-stream',
      )
    }
    if (chunk.usage && typeof chunk.usage === 'object') this.usage = chunk.usage
    let out = ''
    const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : undefined
    const delta = choice?.delta
    if (typeof delta?.content === 'string' && delta.content.length > 0) out += this.text(delta.content)
    if (Array.isArray(delta?.tool_calls)) for (const tc of delta.tool_calls) out += this.toolCall(tc)
    if (typeof choice?.finish_reason === 'string') this.finish = choice.finish_reason
    if (this.outputChars > MAX_OUTPUT_CHARS)
      out += this.fail('server_error', `the answer is longer than ${MAX_OUTPUT_CHARS} characters`)
    return out
  }

  private text(delta: string): string {
    let out = ''
    if (this.current?.item.type !== 'message')
      out += this.open(messageOutput(newMessageId(), '', 'completed'))
    const item = this.current!.item as ReturnType<typeof messageOutput>
    item.content[0]!.text += delta
    this.outputChars += delta.length
    return (
      out +
      this.event('response.output_text.delta', {
        item_id: item.id,
        output_index: this.current!.index,
        content_index: 0,
        delta,
        logprobs: [],
      })
    )
  }

  private toolCall(tc: {
    index?: unknown
    id?: unknown
    function?: { name?: unknown; arguments?: unknown }
  }) {
    const chatIndex = typeof tc.index === 'number' ? tc.index : 0
    let out = ''
    let open = this.calls.get(chatIndex)
    if (!open) {
      const item: FunctionCallOutput = {
        type: 'function_call',
        id: newCallItemId(),
        call_id: typeof tc.id === 'string' ? tc.id : newCallItemId(),
        name: typeof tc.function?.name === 'string' ? tc.function.name : '',
        arguments: '',
        status: 'in_progress',
      }
      out += this.open(item, chatIndex)
      open = this.current!
      this.calls.set(chatIndex, open)
    } else if (typeof tc.function?.name === 'string' && (open.item as FunctionCallOutput).name === '') {
      ;(open.item as FunctionCallOutput).name = tc.function.name
    }
    const args = tc.function?.arguments
    if (typeof args === 'string' && args.length > 0) {
      const item = open.item as FunctionCallOutput
      item.arguments += args
      this.outputChars += args.length
      out += this.event('response.function_call_arguments.delta', {
        item_id: item.id,
        output_index: open.index,
        delta: args,
      })
    }
    return out
  }

  /** Closes the open item (if any) and opens this one. */
  private open(item: OutputItem, chatIndex?: number): string {
    let out = this.closeCurrent()
    const index = this.output.length
    this.output.push(item)
    this.current = { index, item, ...(chatIndex !== undefined && { chatIndex }) }
    if (item.type === 'message') {
      const added = { ...item, status: 'in_progress', content: [] }
      out += this.event('response.output_item.added', { output_index: index, item: added })
      out += this.event('response.content_part.added', {
        item_id: item.id,
        output_index: index,
        content_index: 0,
        part: { type: 'output_text', text: '', annotations: [] },
      })
    } else {
      out += this.event('response.output_item.added', { output_index: index, item: { ...item } })
    }
    return out
  }

  private closeCurrent(): string {
    const open = this.current
    if (!open) return ''
    this.current = undefined
    const status = statusOf(this.finish).status
    const item = open.item
    item.status = status
    if (item.type === 'message') {
      const part = item.content[0]!
      return (
        this.event('response.output_text.done', {
          item_id: item.id,
          output_index: open.index,
          content_index: 0,
          text: part.text,
          logprobs: [],
        }) +
        this.event('response.content_part.done', {
          item_id: item.id,
          output_index: open.index,
          content_index: 0,
          part: { type: 'output_text', text: part.text, annotations: [] },
        }) +
        this.event('response.output_item.done', { output_index: open.index, item })
      )
    }
    return (
      this.event('response.function_call_arguments.done', {
        item_id: item.id,
        output_index: open.index,
        name: item.name,
        arguments: item.arguments,
      }) + this.event('response.output_item.done', { output_index: open.index, item })
    )
  }

  /**
   * The final Response once the chat stream is over (it sent [DONE], or ended after its usage):
   * the closing events are produced by `finalEvents` once the caller has stored it.
   */
  final(): ResponseObject | undefined {
    if (this.failure || !(this.sawDone || this.usage)) return undefined
    const { status, incomplete_details } = statusOf(this.finish)
    if (this.output.length === 0) this.pending = this.open(messageOutput(newMessageId(), '', 'completed'))
    this.pending += this.closeCurrent()
    const usage = this.usage ? responsesUsage(this.usage) : null
    return responseObject(this.head, status, this.output, usage, { incomplete_details })
  }
  private pending = ''

  /** The items' closing events and response.completed (or .incomplete) with the whole response. */
  finalEvents(r: ResponseObject): string {
    const out = this.pending
    this.pending = ''
    return (
      out +
      this.event(r.status === 'incomplete' ? 'response.incomplete' : 'response.completed', { response: r })
    )
  }

  /** Fails the stream: closes nothing more, sends response.failed. */
  fail(code: string, message: string): string {
    if (this.failure) return ''
    this.failure = { code, message }
    this.current = undefined
    const r = responseObject(
      this.head,
      'failed',
      this.output,
      this.usage ? responsesUsage(this.usage) : null,
      {
        error: this.failure,
      },
    )
    return this.event('response.failed', { response: r })
  }
}

const encoder = new TextEncoder()

/**
 * The client's SSE body: the chat stream `chat` read one chunk per pull and translated, so a
 * client that does not read stops the relay (and through it the upstream) as on chat; nothing
 * is queued beyond one chunk's events. `store` runs once the final response is known, before
 * response.completed is sent (a client that retrieves it after the stream finds it).
 */
export function responsesStream(
  chat: ReadableStream<Uint8Array>,
  t: ResponsesStreamTranslator,
  store: (r: ResponseObject) => Promise<ResponseObject>,
): ReadableStream<Uint8Array> {
  const reader = chat.getReader()
  let started = false
  let finished = false
  let cancelled = false
  const stop = (reason: string) => {
    reader.cancel(new Error(reason)).catch(() => {})
  }
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (!started) {
          started = true
          controller.enqueue(encoder.encode(t.start()))
          return
        }
        for (;;) {
          let read: { done: boolean; value?: Uint8Array | undefined }
          try {
            read = await reader.read()
          } catch {
            read = { done: true, value: undefined }
            if (cancelled) return
            if (!finished && !t.failure) {
              controller.enqueue(encoder.encode(t.fail('server_error', 'the upstream broke the stream')))
              controller.close()
              return
            }
          }
          // The client went away while the chat stream was read: nothing more to send.
          if (cancelled) return
          let out = read.done || !read.value ? '' : t.push(read.value)
          if (t.failure) {
            stop('the responses stream failed')
            controller.enqueue(encoder.encode(out))
            controller.close()
            return
          }
          if (!finished && (t.sawDone || read.done)) {
            const r = t.final()
            if (r) {
              finished = true
              const kept = await store(r)
              if (cancelled) return
              out += t.finalEvents(kept)
            } else if (read.done) out += t.fail('server_error', 'the upstream ended the stream early')
          }
          if (out.length > 0) controller.enqueue(encoder.encode(out))
          if (read.done) {
            controller.close()
            return
          }
          if (out.length > 0) return
        }
      },
      cancel(reason) {
        cancelled = true
        return reader.cancel(reason)
      },
    },
    { highWaterMark: 0 },
  )
}
