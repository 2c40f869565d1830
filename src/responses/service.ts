import type { ResponsesRequest } from '../api/responses.ts'
import { RECEIPT_HEADER } from '../billing/receipts.ts'
import { InvalidValue, quoted, responseNotFound } from '../errors.ts'
import { sortableId } from '../ids.ts'
import { EXPLAIN_HEADER, OVERHEAD_HEADER } from '../metrics/telemetry.ts'
import { type ChatDeps, chatCompletion, type Payer } from '../pipeline/chat.ts'
import type { Store } from '../storage/store.ts'
import type { RequestTrace } from '../tracing/span.ts'
import type { Usage } from '../upstream/sse.ts'
import { ResponsesStreamTranslator, responsesStream } from './stream.ts'
import {
  type Item,
  inputItems,
  type ResponseHead,
  type ResponseObject,
  responseOfCompletion,
  toChatRequest,
} from './translate.ts'

export interface ResponsesConfig {
  /**
   * Stored responses older than this are gone (404) and swept from the store; 0 keeps them.
   */
  readonly retentionSec: number
  /**
   * A stored conversation (the previous one and this input, as JSON, with the instructions and
   * tools the stored response repeats) is at most this big before its output is added: a chain
   * of previous_response_id cannot grow a row without bound. Past it: a 400, before any billing.
   */
  readonly maxStoredBytes: number
}

/** Expired responses are swept at most this often, this many rows a statement. */
const SWEEP_EVERY_MS = 3600_000
const SWEEP_ROWS = 500

/**
 * POST/GET/DELETE /v1/responses: translate in (items -> an OpenAI chat request), run the chat
 * lifecycle unchanged (reserve -> route -> relay -> settle), translate out; stored responses
 * are kept per organization in the store.
 */
export class ResponsesService {
  private lastSweepMs = 0
  private sweeping = false

  constructor(
    private readonly deps: ChatDeps,
    private readonly store: Store,
    private readonly cfg: ResponsesConfig,
  ) {}

  /** A stored response of this organization that has not expired. */
  private async stored(orgId: string, id: string) {
    const rec = await this.store.getResponse(orgId, id)
    if (!rec) return undefined
    const r = this.cfg.retentionSec
    return r > 0 && rec.createdAt < Date.now() / 1000 - r ? undefined : rec
  }

  /**
   * Deletes expired responses in the background, SWEEP_ROWS at a time with the event loop free
   * in between; started at most once per SWEEP_EVERY_MS (by a request that stores one).
   */
  private sweep(): void {
    const now = Date.now()
    if (this.cfg.retentionSec === 0 || this.sweeping || now - this.lastSweepMs < SWEEP_EVERY_MS) return
    this.lastSweepMs = now
    this.sweeping = true
    const before = Math.floor(now / 1000) - this.cfg.retentionSec
    const round = async (): Promise<void> => {
      const n = await this.store.deleteResponsesBefore(before, SWEEP_ROWS)
      if (n === SWEEP_ROWS) {
        await new Promise((resolve) => setImmediate(resolve))
        return round()
      }
    }
    round()
      .catch((err) => this.deps.log('error', 'sweeping expired responses failed', { error: String(err) }))
      .finally(() => {
        this.sweeping = false
      })
  }

  async create(
    payer: Payer,
    body: ResponsesRequest,
    signal: AbortSignal,
    requestId: string,
    sessionHint?: string,
    cut?: () => void,
    trace?: RequestTrace,
  ): Promise<Response> {
    const store = body.store !== false
    let prior: Item[] = []
    if (body.previous_response_id) {
      const rec = await this.stored(payer.org.id, body.previous_response_id)
      if (!rec) throw responseNotFound(body.previous_response_id, 'previous_response_id')
      prior = JSON.parse(rec.conversation) as Item[]
    }
    const items = prior.concat(inputItems(body.input))
    const chat = toChatRequest(body, items, prior.length)
    // Refused before anything is billed: what would be stored is already too big.
    if (store) {
      // The conversation, and what the stored response repeats of the request.
      const bytes =
        Buffer.byteLength(JSON.stringify(items)) +
        Buffer.byteLength(body.instructions ?? '') +
        (body.tools ? Buffer.byteLength(JSON.stringify(body.tools)) : 0)
      if (bytes > this.cfg.maxStoredBytes)
        throw new InvalidValue(
          `the conversation to store (previous_response_id's, this input, instructions and tools) is ${bytes} bytes, more than ${this.cfg.maxStoredBytes}; start a new conversation or send store: false`,
          body.previous_response_id ? 'previous_response_id' : 'input',
        )
    }
    const head: ResponseHead = {
      id: `resp_${sortableId()}`,
      createdAt: Math.floor(Date.now() / 1000),
      model: body.model,
      body,
      store,
    }
    const answer = await chatCompletion(this.deps, payer, chat, signal, requestId, sessionHint, cut, trace)
    if (payer.quoteOnly) return answer // a quote, nothing stored
    const headers: Record<string, string> = {}
    for (const name of [
      'x-tropa-node',
      'x-tropa-cost-rub',
      RECEIPT_HEADER,
      OVERHEAD_HEADER,
      EXPLAIN_HEADER,
    ]) {
      const v = answer.headers.get(name)
      if (v !== null) headers[name] = v
    }
    const keep = async (r: ResponseObject): Promise<ResponseObject> => {
      if (!store) return r
      try {
        await this.store.putResponse({
          id: r.id,
          orgId: payer.org.id,
          conversation: JSON.stringify([...withIds(items), ...(r.output as unknown as Item[])]),
          response: JSON.stringify(r),
          createdAt: r.created_at,
        })
        this.sweep()
        return r
      } catch (err) {
        // The answer is billed and is the client's: it gets it, marked as not stored.
        this.deps.log('error', 'storing a response failed', { error: String(err), requestId })
        return { ...r, store: false }
      }
    }

    if (body.stream !== true) {
      const completion = (await answer.json()) as { choices?: unknown; usage: Usage }
      const r = await keep(responseOfCompletion(head, completion))
      return Response.json(r, { headers })
    }

    const translator = new ResponsesStreamTranslator(head)
    return new Response(responsesStream(answer.body!, translator, keep), {
      headers: {
        ...headers,
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
        connection: 'keep-alive',
      },
    })
  }

  /** A stored response of the caller's organization, as the JSON it was returned as. */
  async get(orgId: string, id: string): Promise<Response> {
    const rec = await this.stored(orgId, id)
    if (!rec) throw responseNotFound(id)
    return new Response(rec.response, { headers: { 'content-type': 'application/json' } })
  }

  /**
   * GET /v1/responses/{id}/input_items: the items the response answered (its previous
   * conversation and its input), as OpenAI lists them: a page of `limit`, newest first unless
   * `order` is asc, after the item `after`.
   */
  async inputItems(
    orgId: string,
    id: string,
    q: { limit: number; order: 'asc' | 'desc'; after: string | undefined },
  ) {
    const rec = await this.stored(orgId, id)
    if (!rec) throw responseNotFound(id)
    const conversation = JSON.parse(rec.conversation) as Item[]
    const outputs = (JSON.parse(rec.response) as { output?: unknown[] }).output?.length ?? 0
    const items = conversation.slice(0, conversation.length - outputs).map(listedItem)
    if (q.order === 'desc') items.reverse()
    let from = 0
    if (q.after !== undefined) {
      from = items.findIndex((item) => item.id === q.after) + 1
      if (from === 0) throw new InvalidValue(`no input item ${quoted(q.after)} in this response`, 'after')
    }
    const data = items.slice(from, from + q.limit)
    return {
      object: 'list',
      data,
      first_id: data[0]?.id ?? null,
      last_id: data.at(-1)?.id ?? null,
      has_more: from + q.limit < items.length,
    }
  }

  async remove(orgId: string, id: string) {
    if (!(await this.store.deleteResponse(orgId, id))) throw responseNotFound(id)
    return { id, object: 'response', deleted: true }
  }
}

const ID_PREFIX: Record<string, string> = {
  message: 'msg_',
  function_call: 'fc_',
  function_call_output: 'fco_',
}

/** Items as stored: each with an id (the input_items list names them), given ones kept. */
function withIds(items: readonly Item[]): Item[] {
  return items.map((item) => {
    if (typeof (item as { id?: unknown }).id === 'string') return item
    return { ...item, id: `${ID_PREFIX[item.type ?? 'message'] ?? 'item_'}${sortableId()}` } as Item
  })
}

/** A stored item as OpenAI lists it: a message's string content as one text part. */
function listedItem(item: Item): Item & { id?: string } {
  const m = item as { type?: string; role?: string; content?: unknown }
  if ((m.type ?? 'message') !== 'message' || typeof m.content !== 'string') return item
  const type = m.role === 'assistant' ? 'output_text' : 'input_text'
  return { status: 'completed', ...item, type: 'message', content: [{ type, text: m.content }] } as Item
}
