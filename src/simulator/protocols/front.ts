import type { ProviderKind } from '../../config/schema.ts'

// The contract between a simulated node and its protocol fronts (index.ts lists the fronts).

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
