import type { Config, ModelConfig } from '../config/load.ts'
import type { BatchStatus } from '../storage/store.ts'

// Messages between the main thread (money, routing, state transitions) and the batch worker
// threads (validation, upstream calls, result files). Structured clone carries bigint.

export interface WorkerInit {
  /** The store the worker opens for itself (a connection of its own). */
  readonly storage: Config['storage']
  readonly filesDir: string
  readonly models: readonly ModelConfig[]
  readonly firstByteTimeoutMs: number
  /** The longest a response body may take once its headers came, as on the live path. */
  readonly idleTimeoutMs: number
  readonly leaseMs: number
  /** Lines one worker keeps in flight at most. */
  readonly concurrency: number
  readonly maxAttempts: number
}

export interface ValidationError {
  readonly code: string
  readonly line: number | null
  readonly message: string
  readonly param: string | null
}

export type ToWorker =
  | {
      readonly t: 'validate'
      readonly batchId: string
      /** The batch key's `models` (ids or patterns); null: every model. */
      readonly keyModels: readonly string[] | null
    }
  | { readonly t: 'finalize'; readonly batchId: string; readonly status: BatchStatus }
  | { readonly t: 'admitted'; readonly reqId: number; readonly reply: AdmitReply }
  /** Interactive traffic needs the line's node: cancel its upstream call and give it back. */
  | { readonly t: 'preempt'; readonly reqId: number }
  | { readonly t: 'stop' }
  /** A reloaded config's models: lines priced and validated from now on use them. */
  | { readonly t: 'models'; readonly models: readonly ModelConfig[] }

export type AdmitReply =
  | {
      readonly kind: 'go'
      /** The node's name (the ledger row's). */
      readonly node: string
      readonly baseUrl: string
      readonly upstreamModel: string
      readonly apiKey: string | undefined
      /** The line's trace, continued upstream (tracing on). */
      readonly traceparent?: string
      /** The receipt key the line's ledger row records (null: receipts off). */
      readonly receiptKid: string | null
    }
  /** No node has headroom beyond the interactive reserve: try again later. */
  | { readonly kind: 'wait'; readonly ms: number }
  /** The batch stopped running, or its money ran out: give the line back. */
  | { readonly kind: 'stop'; readonly code: string }

export type FromWorker =
  | {
      readonly t: 'validated'
      readonly batchId: string
      readonly total: number
      readonly estimateNano: bigint
      readonly errors: readonly ValidationError[]
    }
  | {
      readonly t: 'admit'
      readonly reqId: number
      readonly batchId: string
      readonly line: number
      readonly model: string
      readonly promptTokens: number
      /** Worst-case cost of the line at the batch price. */
      readonly worstNano: bigint
    }
  | {
      readonly t: 'settle'
      readonly reqId: number
      /** Usage when the upstream answered 2xx; otherwise nothing is charged. */
      readonly usage: {
        readonly promptTokens: number
        readonly completionTokens: number
        /** As the upstream reported them (prompt_tokens_details.cached_tokens), else null. */
        readonly cachedTokens: number | null
        /** From the line's start to its whole answer. */
        readonly ttftMs: number
      } | null
      readonly nodeOk: boolean
      readonly outcome: string
    }
  | { readonly t: 'finalized'; readonly batchId: string }
  /** A job failed (the store was unreachable, say); the scheduler tries it again at its next tick. */
  | { readonly t: 'error'; readonly batchId?: string; readonly message: string }
