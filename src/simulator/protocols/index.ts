import { anthropicFront } from './anthropic.ts'
import { azureFront } from './azure.ts'
import type { ProtocolFront, SimProtocol } from './front.ts'
import { geminiFront } from './gemini.ts'
import { gigachat } from './gigachat.ts'
import { yandex } from './yandex.ts'

export type { ProtocolFront, SimCore, SimProtocol } from './front.ts'

// A simulated node speaks OpenAI's API natively; `protocol` puts a front on it that speaks a
// provider's own API as its public reference describes it (paths, auth, fields, event names,
// error bodies). A front translates the provider's request into the node's OpenAI form, lets the
// node's engine answer, and translates the answer back: the same timing model (queueing,
// prefill, tokens) whatever the protocol. Each front is checked with the provider's official SDK.

/** The fronts this build has; `openai` needs none. */
export const PROTOCOLS: Partial<Record<SimProtocol, ProtocolFront>> = {
  gemini: geminiFront,
  azure: azureFront,
  anthropic: anthropicFront,
  gigachat,
  yandex,
}
