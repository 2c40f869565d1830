import { type ConcurrencyLimiter, concurrencyReached } from '../billing/concurrency.ts'
import type { MoneyMeter } from '../billing/meter.ts'
import { formatRub, type NanoRub } from '../billing/money.ts'
import { hasRateLimits, type RateLimiter } from '../billing/rate-limiter.ts'
import type { ModelConfig } from '../config/load.ts'
import {
  BudgetExhausted,
  endUserBudgetExhausted,
  insufficientBalance,
  keyBudgetExhausted,
  keyLimitReached,
  type TropaError,
} from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { RouteRequest } from '../routing/policy.ts'
import type { UpstreamDeps } from './dispatch.ts'
import type { PromptPrefix } from './prefix.ts'

/** The request header that asks for a quote instead of an answer. */
export const DRY_RUN_HEADER = 'x-tropa-dry-run'

/** What a request would do, asked for with `x-tropa-dry-run: 1`; nothing is charged or sent. */
export interface Quote {
  readonly object: 'quote'
  readonly model: string
  /** Tropa's count of the prompt. */
  readonly prompt_tokens: number
  /** The most output tokens the answer may bill (the bound times the choices asked for). */
  readonly max_output_tokens: number
  /** The worst case held before the call, roubles (what is released at settlement is not known). */
  readonly reserve_rub: number
  /**
   * Whether admission would pass now: the key's limit, its period budgets (its own, its end
   * user's) and the organization's balance, the key's max_concurrency, and the rate limits (the
   * key's, the organization's, the model's).
   */
  readonly admitted: boolean
  /** Why not, as the 402 or 429 would say it (the first check that refuses, in admission's order). */
  readonly refusal: {
    readonly code: string
    readonly message: string
    /** A spent period budget: when it resets, Unix seconds (as the 402's x-tropa-budget-resets-at). */
    readonly resets_at?: number
  } | null
  /** The node the routing policy would choose now, and its predicted time to first token. */
  readonly node: string | null
  readonly predicted_ttft_ms: number | null
}

/**
 * The quote of one model call: the reservation it would make, checked as `reserve` checks it
 * (the key's limit first, then the balance; in a cluster against every node's charges and
 * holds), and the node the policy would pick for it. A quote is a snapshot: a request sent
 * after it may find the money or the node taken.
 */
export async function quoteCall(
  deps: Pick<UpstreamDeps, 'pool' | 'policy'> & {
    readonly meter: MoneyMeter
    readonly limiter: RateLimiter
    readonly concurrency: ConcurrencyLimiter
  },
  payer: { readonly key: LiveKey; readonly org: LiveOrg; readonly endUser?: string | undefined },
  call: {
    readonly model: ModelConfig
    readonly promptTokens: number
    readonly worstOutputTokens: number
    readonly stream: boolean
    readonly prefix: () => PromptPrefix
    readonly session: string | undefined
  },
  worstNano: NanoRub,
  requestId: string,
): Promise<Response> {
  const refusal =
    (await refusalOf(deps.meter, payer.key, payer.org, worstNano, payer.endUser)) ??
    (await admissionRefusal(deps, payer.key, payer.org, call.model.id, call.promptTokens))
  const prefix = call.prefix()
  const req: RouteRequest = {
    modelId: call.model.id,
    promptTokens: call.promptTokens,
    prefix: prefix.blocks,
    blockTokens: prefix.blockTokens,
    session: call.session,
    stream: call.stream,
    exclude: new Set(),
    nowMs: Date.now(),
    batchQuietMs: deps.pool.batchQuietMs,
  }
  const chosen = deps.policy.choose(deps.pool.candidates(call.model.id), req)
  const ttft = chosen ? deps.policy.estimateTtftMs?.(chosen, req) : undefined
  const quote: Quote = {
    object: 'quote',
    model: call.model.id,
    prompt_tokens: call.promptTokens,
    max_output_tokens: call.worstOutputTokens,
    reserve_rub: Number(formatRub(worstNano)),
    admitted: refusal === null,
    refusal: refusal && {
      code: refusal.code,
      message: refusal.message,
      ...(refusal instanceof BudgetExhausted && { resets_at: refusal.resetsAtSec }),
    },
    node: chosen?.node.name ?? null,
    predicted_ttft_ms: ttft === undefined ? null : Math.round(ttft * 10) / 10,
  }
  return Response.json(quote, { headers: { 'x-request-id': requestId, [DRY_RUN_HEADER]: '1' } })
}

/** The 429 the key's max_concurrency or the rate limits would answer now, or null; nothing is counted. */
async function admissionRefusal(
  deps: { readonly limiter: RateLimiter; readonly concurrency: ConcurrencyLimiter },
  key: LiveKey,
  org: LiveOrg,
  modelId: string,
  promptTokens: number,
): Promise<TropaError | null> {
  if (key.maxConcurrency !== null && (await deps.concurrency.inFlight(key)) >= key.maxConcurrency)
    return concurrencyReached(key)
  return hasRateLimits(key, org) ? deps.limiter.refusal(key, org, modelId, promptTokens) : null
}

/** The 402 that reserving `amountNano` would meet now, or null (checked in the order reserve checks). */
async function refusalOf(
  meter: MoneyMeter,
  key: LiveKey,
  org: LiveOrg,
  amountNano: NanoRub,
  endUser: string | undefined,
): Promise<TropaError | null> {
  // In a cluster the shared rooms say what every node charged and holds; on one node the live
  // objects are the truth.
  const standing = meter.standing ? await meter.standing(org, [key]) : undefined
  const spent = standing?.spentNano.get(key.id) ?? key.spentNano
  if (key.limitNano !== null && spent + key.reservedNano + amountNano > key.limitNano)
    return keyLimitReached()
  // Period budgets: what the current period holds (every node's charges and holds in a cluster).
  if (key.budget !== null) {
    const b = await meter.budgetNow(key)
    if (b && b.committedNano + amountNano > key.budget.amountNano) return keyBudgetExhausted(b.span.endMs)
  }
  if (endUser !== undefined && key.endUserBudget !== null) {
    const b = await meter.budgetNow(key, endUser)
    if (b && b.committedNano + amountNano > key.endUserBudget.amountNano)
      return endUserBudgetExhausted(b.span.endMs)
  }
  const balance = standing?.balanceNano ?? org.balanceNano
  const reserved = standing?.reservedNano ?? org.reservedNano
  if (reserved + amountNano > balance) return insufficientBalance()
  return null
}
