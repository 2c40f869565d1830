import { type EmbeddingRequest, MAX_EMBEDDING_INPUTS } from '../api/embeddings.ts'
import type { Slot } from '../billing/concurrency.ts'
import { costNano, formatRub, nanoToRubNumber } from '../billing/money.ts'
import { hasRateLimits } from '../billing/rate-limiter.ts'
import { RECEIPT_HEADER } from '../billing/receipts.ts'
import {
  ContextLengthExceeded,
  InvalidValue,
  modelNotAllowed,
  TooManyInputs,
  UpstreamFailed,
} from '../errors.ts'
import type { RequestTrace } from '../tracing/span.ts'
import { admit, type ChatDeps, type Payer, reserve } from './chat.ts'
import { dispatch, finishAttempt, readBody } from './dispatch.ts'
import { loadTokenizer, PromptCounter, reservedPromptTokens } from './tokens.ts'

// The usage value: an object (with objects one level down, as prompt_tokens_details), or a scalar.
const USAGE = /^"usage"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}|"(?:[^"\\]|\\.)*"|[^\s,}\]]+)/

/**
 * POST /v1/embeddings. The upstream's body is forwarded as text with one substring swap (the
 * model name): a 2048-vector response is megabytes of JSON, not worth parsing and re-writing.
 */
export async function createEmbeddings(
  deps: ChatDeps,
  payer: Payer,
  body: EmbeddingRequest,
  signal: AbortSignal,
  requestId: string,
  /** The request's trace (tracing on): reserve, each attempt and settle become spans. */
  trace?: RequestTrace,
): Promise<Response> {
  const startedAtMs = Date.now()
  const model = deps.catalogue.getOfKind(body.model, 'embedding')
  if (!payer.key.allows(model.id)) throw modelNotAllowed(model.id)
  const inputs = checkInputs(body.input)
  if (body.dimensions !== undefined && model.dimensions !== undefined && body.dimensions > model.dimensions)
    throw new InvalidValue(`dimensions must be at most ${model.dimensions} for ${model.id}`, 'dimensions')
  await loadTokenizer()
  // Counted a slice at a time (the event loop runs between), each input up to the context.
  const counter = new PromptCounter()
  for (let i = 0; i < inputs.length; i++) {
    const input = inputs[i]!
    const before = counter.n
    if (typeof input === 'string') {
      counter.limit = before + model.contextLength
      const slow = counter.add(input)
      if (slow) await slow
    } else counter.n += input.length
    const n = counter.n - before
    if (n > model.contextLength)
      throw new ContextLengthExceeded(
        `input[${i}] has ${n} tokens; ${model.id} takes at most ${model.contextLength}`,
        'input',
      )
  }
  const promptTokens = counter.n
  const rec = deps.telemetry.of(requestId)
  rec?.call(model.id, payer.org.id, payer.key.id)
  const reservation = await reserve(
    deps,
    payer,
    costNano(reservedPromptTokens(promptTokens), 0, model.price),
    trace,
  )
  // Counted only once the money is reserved, so a 402 does not eat into the limits (chat.ts admit).
  let slot: Slot | undefined
  try {
    if (payer.key.maxConcurrency !== null || hasRateLimits(payer.key, payer.org))
      slot = await admit(deps, payer, model.id, promptTokens)
    const answer = await dispatch(
      deps,
      {
        model,
        path: '/embeddings',
        stream: false,
        promptTokens,
        prefix: [],
        blockTokens: 0,
        session: undefined,
        body: (r) => JSON.stringify({ ...body, model: r.upstreamModel }),
        trace,
        accept: async (reply, c) => {
          const text = await readBody(reply, deps, c.node.name)
          if (!text.includes('"data"'))
            throw new UpstreamFailed(`${c.node.name} sent a malformed embeddings response`)
          const usage = usageSpan(text)
          let tokens: number | undefined
          if (usage?.object) {
            try {
              const u = JSON.parse(text.slice(usage.start, usage.end)) as { prompt_tokens?: unknown }
              // Untrusted: only a whole, non-negative count is billed; otherwise Tropa's own.
              if (Number.isSafeInteger(u.prompt_tokens) && (u.prompt_tokens as number) >= 0)
                tokens = u.prompt_tokens as number
            } catch {
              // counted below
            }
          }
          const modelField = new RegExp(`"model"\\s*:\\s*${escapeRe(JSON.stringify(c.route.upstreamModel))}`)
          return { text: text.replace(modelField, () => `"model":${JSON.stringify(model.id)}`), tokens }
        },
      },
      signal,
    )
    const { value, candidate, attempt } = answer
    rec?.answered(answer, candidate.node.name, false, performance.now())
    // The whole answer has arrived: an embedding's first byte is of no use without the rest.
    const ttftMs = Date.now() - startedAtMs
    finishAttempt(deps, attempt, 'ok')
    const tokens = value.tokens ?? promptTokens
    slot?.release()
    const receiptKid = deps.receipts?.kid ?? null
    const endedAtMs = Date.now()
    const charged = deps.meter.settle(reservation, {
      requestId,
      model: model.id,
      node: candidate.node.name,
      promptTokens: tokens,
      completionTokens: 0,
      costNano: costNano(tokens, 0, model.price),
      batchId: null,
      startedAtMs,
      endedAtMs,
      outcome: 'ok',
      estimated: value.tokens === undefined,
      ttftMs,
      endUser: payer.endUser ?? null,
      receiptKid,
    })
    rec?.settled(tokens, 0, 0, charged)
    if (trace) {
      trace.child('settle').end()
      trace.end({
        'gen_ai.response.model': model.id,
        'gen_ai.provider.name': candidate.route.provider,
        'gen_ai.usage.input_tokens': tokens,
        'tropa.node': candidate.node.name,
        'tropa.cost_rub': formatRub(charged),
        'tropa.estimated_usage': value.tokens === undefined,
      })
    }
    const costRub = nanoToRubNumber(charged)
    const receipt =
      deps.receipts?.responses && receiptKid
        ? await deps.receipts.sign(receiptKid, {
            requestId,
            orgId: payer.org.id,
            keyId: payer.key.id,
            model: model.id,
            promptTokens: tokens,
            cachedTokens: 0,
            completionTokens: 0,
            costNano: charged,
            endedAtMs,
          })
        : undefined
    // The client sees the usage billed: the upstream's with its cost, or Tropa's count, marked.
    const shown =
      value.tokens === undefined
        ? withUsage(value.text, {
            prompt_tokens: tokens,
            total_tokens: tokens,
            estimated: true,
            cost_rub: costRub,
            ...(receipt && { receipt }),
          })
        : withCost(value.text, costRub, receipt)
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      'x-request-id': requestId,
      'x-tropa-node': candidate.node.name,
      'x-tropa-cost-rub': formatRub(charged),
    }
    if (receipt) headers[RECEIPT_HEADER] = receipt
    if (rec) deps.telemetry.stamp(rec, headers)
    return new Response(shown, { headers })
  } catch (err) {
    slot?.release()
    deps.meter.release(reservation)
    throw err
  }
}

/** The inputs as a list; 400 for empty ones or more than 2048. */
export function checkInputs(input: EmbeddingRequest['input']): (string | number[])[] {
  if (typeof input === 'string') {
    if (input.length === 0) throw new InvalidValue('input must not be empty', 'input')
    return [input]
  }
  if (input.length === 0) throw new InvalidValue('input must not be an empty array', 'input')
  // An array of integers is one tokenised input; an array of strings or arrays is many.
  if (typeof input[0] === 'number') return [input as number[]]
  if (input.length > MAX_EMBEDDING_INPUTS) throw new TooManyInputs(MAX_EMBEDDING_INPUTS)
  const list = input as (string | number[])[]
  list.forEach((item, i) => {
    if (item.length === 0) throw new InvalidValue(`input[${i}] must not be empty`, `input[${i}]`)
  })
  return list
}

/** Where the body's (last) usage value is, and whether it is an object. */
function usageSpan(text: string): { key: number; start: number; end: number; object: boolean } | undefined {
  const key = text.lastIndexOf('"usage"')
  if (key < 0) return undefined
  const m = USAGE.exec(text.slice(key))
  if (!m) return undefined
  const value = m[1]!
  const end = key + m[0].length
  return { key, start: end - value.length, end, object: value.startsWith('{') }
}

/** Adds `cost_rub` (and the receipt) to the usage object without re-serialising the vectors. */
function withCost(text: string, costRub: number, receipt: string | undefined): string {
  const u = usageSpan(text)
  if (!u?.object) return text
  const extra = receipt === undefined ? '' : `,"receipt":${JSON.stringify(receipt)}`
  return `${text.slice(0, u.end - 1)},"cost_rub":${costRub}${extra}${text.slice(u.end - 1)}`
}

/** Puts `usage` in place of the body's usage value, or adds it when there is none. */
function withUsage(text: string, usage: Record<string, unknown>): string {
  const json = JSON.stringify(usage)
  const u = usageSpan(text)
  if (u) return `${text.slice(0, u.start)}${json}${text.slice(u.end)}`
  const close = text.lastIndexOf('}')
  return close < 0 ? text : `${text.slice(0, close)},"usage":${json}${text.slice(close)}`
}

function escapeRe(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
}
