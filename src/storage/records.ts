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
  /**
   * The receipt key the request was signed with (docs/api.md, "Receipts"); null or absent when
   * receipts were off, and for credits. An export re-signs the row with it.
   */
  readonly receiptKid?: string | null
}
