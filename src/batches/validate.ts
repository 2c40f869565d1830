import { Value } from '@sinclair/typebox/value'
import { ChatRequest } from '../api/chat.ts'
import { CompletionRequest } from '../api/completions.ts'
import { EmbeddingRequest } from '../api/embeddings.ts'
import { knownTypeError, ResponsesRequest } from '../api/responses.ts'
import { fromValueError } from '../api/value-error.ts'
import { batchCostNano, costNano } from '../billing/money.ts'
import type { ModelConfig } from '../config/load.ts'
import { TropaError } from '../errors.ts'
import { MAX_JSON_DEPTH, nestedDeeperThan } from '../json-depth.ts'
import { askedOutput, checkMessages, outputBudget } from '../pipeline/chat.ts'
import { legacyOutput, passesCompletionsThrough, promptsOf, toChat } from '../pipeline/completions.ts'
import { checkInputs } from '../pipeline/embeddings.ts'
import { countChatPrompt, countTokens, reservedPromptTokens } from '../pipeline/tokens.ts'
import { inputItems, toChatRequest } from '../responses/translate.ts'
import type { BatchLine } from '../storage/store.ts'
import type { ValidationError } from './protocol.ts'

export const MAX_REPORTED_ERRORS = 1000

export interface LineCost {
  readonly model: ModelConfig
  readonly promptTokens: number
  /** Worst case at the batch price (half). */
  readonly worstNano: bigint
  /** Chat: the output bound reserved for, sent upstream as max_tokens (and max_completion_tokens). */
  readonly maxOut?: number
  /** A /v1/completions or /v1/responses line: the chat request it stands for (what is priced and sent). */
  readonly chatBody?: ChatRequest
  /** A /v1/completions line sent as it is to /completions (its model's routes are all OpenAI-compatible). */
  readonly passThrough?: true
}

/**
 * Checks one request body by the live endpoint's rules (schema, message rules, catalogue model
 * of the right kind, context length) and prices its worst case at half. Throws TropaError.
 */
export function priceLine(
  endpoint: string,
  body: unknown,
  models: ReadonlyMap<string, ModelConfig>,
): LineCost {
  if (endpoint === '/v1/responses') {
    const chatBody = chatOf(body)
    return { ...priceLine('/v1/chat/completions', chatBody, models), chatBody }
  }
  const legacy = endpoint === '/v1/completions'
  const chat = legacy || endpoint === '/v1/chat/completions'
  const schema = legacy ? CompletionRequest : chat ? ChatRequest : EmbeddingRequest
  if (!Value.Check(schema, body)) {
    // The same 400 the live endpoint would give, as this line's error.
    const err = fromValueError(Value.Errors(schema, body).First())
    throw new LineError('invalid_body', `body.${err.message}`, err.param ? `body.${err.param}` : 'body')
  }
  const model = models.get(body.model)
  if (!model)
    throw new LineError(
      'model_not_found',
      `the model ${JSON.stringify(body.model)} does not exist`,
      'body.model',
    )
  if (model.kind !== (chat ? 'chat' : 'embedding'))
    throw new LineError('invalid_body', `${model.id} cannot serve ${endpoint}`, 'body.model')
  if (legacy && passesCompletionsThrough(model)) {
    // Passed through, as live: each prompt counted and fitted to the context with its output.
    const req = body as CompletionRequest
    let promptTokens = 0
    let longest = 0
    const prompts = promptsOf(req.prompt)
    for (const p of prompts) {
      const n = typeof p === 'string' ? countTokens(p) : p.length
      if (n > model.contextLength)
        throw new LineError(
          'context_length_exceeded',
          `a prompt has ${n} tokens, over ${model.contextLength}`,
          'body.prompt',
        )
      promptTokens += n
      if (n > longest) longest = n
    }
    const { maxOut, worstOutputTokens } = legacyOutput(model, req, longest, prompts.length)
    const worst = costNano(reservedPromptTokens(promptTokens), worstOutputTokens, model.price)
    return { model, promptTokens, worstNano: batchCostNano(worst), maxOut, passThrough: true }
  }
  if (chat) {
    // A legacy completion is priced and run as the chat request it translates to (as live).
    const req = legacy ? toChat(body as CompletionRequest) : (body as ChatRequest)
    checkMessages(req.messages)
    const promptTokens = countChatPrompt(req.messages, req.tools)
    const maxOut = outputBudget(model, promptTokens, askedOutput(req))
    const worst = costNano(reservedPromptTokens(promptTokens), maxOut * (req.n ?? 1), model.price)
    return { model, promptTokens, worstNano: batchCostNano(worst), maxOut, ...(legacy && { chatBody: req }) }
  }
  const req = body as EmbeddingRequest
  let promptTokens = 0
  for (const input of checkInputs(req.input)) {
    const n = typeof input === 'string' ? countTokens(input) : input.length
    if (n > model.contextLength)
      throw new LineError(
        'context_length_exceeded',
        `an input has ${n} tokens, over ${model.contextLength}`,
        'body.input',
      )
    promptTokens += n
  }
  return {
    model,
    promptTokens,
    worstNano: batchCostNano(costNano(reservedPromptTokens(promptTokens), 0, model.price)),
  }
}

/**
 * A /v1/responses line as the chat request it runs as, checked by the live endpoint's rules; a
 * batch line is not stored and cannot continue a stored response, nor stream.
 */
function chatOf(body: unknown): ChatRequest {
  const invalid = (e: ReturnType<typeof knownTypeError>) => {
    const err = fromValueError(e)
    return new LineError('invalid_body', `body.${err.message}`, err.param ? `body.${err.param}` : 'body')
  }
  if (!Value.Check(ResponsesRequest, body)) throw invalid(Value.Errors(ResponsesRequest, body).First())
  const malformed = knownTypeError(body)
  if (malformed) throw invalid(malformed)
  if (body.stream === true) throw new LineError('invalid_body', 'a batch line cannot stream', 'body.stream')
  if (body.previous_response_id != null)
    throw new LineError(
      'invalid_body',
      'a batch line cannot continue a stored response (previous_response_id)',
      'body.previous_response_id',
    )
  return toChatRequest(body, inputItems(body.input), 0)
}

class LineError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly param: string | null,
  ) {
    super(message)
  }
}

type Checked = { ok: true; line: BatchLine; worstNano: bigint } | { ok: false; error: ValidationError }

/** One JSONL line: its shape, its custom id (unique within `seen`), and its body and price. */
function checkLine(
  batchId: string,
  endpoint: string,
  content: string,
  lineNo: number,
  seen: Set<string>,
  models: ReadonlyMap<string, ModelConfig>,
  allows: ((model: string) => boolean) | undefined,
): Checked {
  const fail = (code: string, message: string, param: string | null = null): Checked => ({
    ok: false,
    error: { code, line: lineNo, message, param },
  })
  let obj: { custom_id?: unknown; method?: unknown; url?: unknown; body?: unknown }
  if (nestedDeeperThan(content, MAX_JSON_DEPTH))
    return fail('invalid_json_line', `the line nests arrays or objects deeper than ${MAX_JSON_DEPTH} levels`)
  try {
    obj = JSON.parse(content)
  } catch {
    return fail('invalid_json_line', 'the line is not valid JSON')
  }
  if (!obj || typeof obj !== 'object' || Array.isArray(obj))
    return fail('invalid_json_line', 'the line is not a JSON object')
  if (typeof obj.custom_id !== 'string' || obj.custom_id.length === 0)
    return fail('missing_custom_id', 'custom_id must be a non-empty string', 'custom_id')
  if (seen.has(obj.custom_id))
    return fail(
      'duplicate_custom_id',
      `custom_id ${JSON.stringify(obj.custom_id)} is used twice`,
      'custom_id',
    )
  seen.add(obj.custom_id)
  if (obj.method !== 'POST') return fail('invalid_method', 'method must be "POST"', 'method')
  if (obj.url !== endpoint)
    return fail('invalid_url', `url must be ${JSON.stringify(endpoint)}, the batch's endpoint`, 'url')
  try {
    const cost = priceLine(endpoint, obj.body, models)
    if (allows && !allows(cost.model.id))
      return fail(
        'model_not_allowed',
        `the batch's API key may not use the model ${cost.model.id}`,
        'body.model',
      )
    const line = {
      batchId,
      line: lineNo,
      customId: obj.custom_id,
      body: JSON.stringify(obj.body),
      attempts: 0,
    }
    return { ok: true, line, worstNano: cost.worstNano }
  } catch (err) {
    if (err instanceof LineError) return fail(err.code, err.message, err.param)
    if (err instanceof TropaError) return fail(err.code, err.message, err.param ? `body.${err.param}` : null)
    throw err
  }
}

/** Validates a whole JSONL file: every line, unique custom ids, and the total worst case. */
export function validateFile(
  batchId: string,
  endpoint: string,
  text: string,
  models: ReadonlyMap<string, ModelConfig>,
  /** The batch key's model scope (identity/live.ts); undefined: every model. */
  allows?: (model: string) => boolean,
): { lines: BatchLine[]; estimateNano: bigint; errors: ValidationError[] } {
  const lines: BatchLine[] = []
  const errors: ValidationError[] = []
  const seen = new Set<string>()
  let estimateNano = 0n
  for (const [i, content] of text.split('\n').entries()) {
    if (content.trim().length === 0) continue
    const r = checkLine(batchId, endpoint, content, i + 1, seen, models, allows)
    if (r.ok) {
      lines.push(r.line)
      estimateNano += r.worstNano
    } else if (errors.length < MAX_REPORTED_ERRORS) errors.push(r.error)
  }
  if (lines.length === 0 && errors.length === 0)
    errors.push({ code: 'empty_file', line: null, message: 'the file has no request lines', param: null })
  return { lines, estimateNano, errors }
}
