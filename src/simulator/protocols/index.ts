import type { ProviderKind } from '../../config/schema.ts'
import { anthropicFront } from './anthropic.ts'
import { azureFront } from './azure.ts'
import { geminiFront } from './gemini.ts'
import { gigachat } from './gigachat.ts'
import { yandex } from './yandex.ts'

// A simulated node speaks OpenAI's API natively; `protocol` puts a front on it that speaks a
// provider's own API as its public reference describes it (paths, auth, fields, event names,
// error bodies). A front translates the provider's request into the node's OpenAI form, lets the
// node's engine answer, and translates the answer back: the same timing model (queueing,
// prefill, tokens) whatever the protocol. Each front is checked with the provider's official SDK.

/** What a front may ask of the node it stands in front of. */
export interface SimCore {
  /** The node's OpenAI chat completion (JSON, or SSE when body.stream): its engine answers. */
  chat(body: Record<string, unknown>, signal: AbortSignal): Promise<Response>
  /** The node's OpenAI embeddings. */
  embeddings(body: Record<string, unknown>): Promise<Response>
  /** The node's configured fault for this request (an error response), if one fires. */
  fault(): Response | undefined
  /** How long the node's access tokens live, for protocols with a token exchange (gigachat). */
  readonly tokenLifetimeMs: number
  /** Counts one token exchange in the node's stats. */
  countAuthRequest(): void
  /** Counts one file stored (gigachat's uploads) in the node's stats. */
  countUpload(): void
}

/** A protocol front: every request of the node goes through it. */
export type ProtocolFront = (req: Request, core: SimCore) => Promise<Response>

export type SimProtocol = ProviderKind

/** The fronts this build has; `openai` needs none. */
export const PROTOCOLS: Partial<Record<SimProtocol, ProtocolFront>> = {
  gemini: geminiFront,
  azure: azureFront,
  anthropic: anthropicFront,
  gigachat,
  yandex,
}
