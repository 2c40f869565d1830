import type { Budget, BudgetPeriod } from '../billing/budgets.ts'
import type { NanoRub } from '../billing/money.ts'

// Records the stores and the ledger's row buffers share (apart from store.ts, which imports the
// row buffer: no cycle between them).

/** One billed request (or balance credit): the ledger row of decisions.md. */
export interface LedgerEntry {
  readonly requestId: string
  readonly kind: 'usage' | 'credit'
  readonly orgId: string
  readonly keyId: string | null
  readonly model: string | null
  readonly node: string | null
  readonly promptTokens: number
  readonly completionTokens: number
  /** Charged amount; a credit is positive and adds to the balance. */
  readonly costNano: NanoRub
  readonly batchId: string | null
  readonly startedAtMs: number
  readonly endedAtMs: number
  readonly outcome: string
  /** Tokens were counted by Tropa because the upstream reported no usage. */
  readonly estimated: boolean
  /** Prompt tokens the upstream served from its cache; null or absent when it did not say. */
  readonly cachedTokens?: number | null
  /**
   * Time to first token: from the request's start to the upstream's first byte (a stream's first
   * chunk, a JSON answer's whole body); null or absent when there was none (credits).
   */
  readonly ttftMs?: number | null
  /** Credits and debits only: the operator's reason (kept in ledger_notes). */
  readonly reason?: string | null
  /** The key owner's end user the request named (`user`, `metadata.user_id`, `x-tropa-end-user`). */
  readonly endUser?: string | null
  /**
   * When the request was admitted, Unix ms, for a key with a period budget (null otherwise): its
   * money counts into the periods containing this instant (a restarted node reads them back).
   */
  readonly admittedAtMs?: number | null
  /**
   * The receipt key the request was signed with (docs/api.md, "Receipts"); null or absent when
   * receipts were off, and for credits. An export re-signs the row with it.
   */
  readonly receiptKid?: string | null
}

/** A budget as both stores keep it: JSON text, the amount as a decimal string (exact past 2^53). */
export function budgetToText(b: Budget): string {
  return JSON.stringify({ amount_nano: b.amountNano.toString(), period: b.period, timezone: b.timezone })
}

export function budgetFromText(text: string): Budget {
  const v = JSON.parse(text) as { amount_nano: string; period: BudgetPeriod; timezone: string }
  return { amountNano: BigInt(v.amount_nano), period: v.period, timezone: v.timezone }
}

/** One model's (or pattern's) limits within an organization: requests and tokens per minute. */
export interface ModelLimit {
  readonly rpm: number | null
  readonly tpm: number | null
}

/** An organization's per-model limits, by model id or pattern (`anthropic/*`). */
export type ModelLimits = Readonly<Record<string, ModelLimit>>
