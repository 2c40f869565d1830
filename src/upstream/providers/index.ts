import type { ProviderKind } from '../../config/schema.ts'
import type { UpstreamAdapter, UpstreamCall, UpstreamReply } from '../adapter.ts'
import type { Watchdog } from '../watchdog.ts'
import { AnthropicAdapter } from './anthropic/adapter.ts'
import { AzureAdapter } from './azure/adapter.ts'
import { GeminiAdapter } from './gemini/adapter.ts'
import { GigaChatAdapter } from './gigachat/adapter.ts'
import { OpenAICompatibleAdapter } from './openai/adapter.ts'
import { YandexAdapter } from './yandex/adapter.ts'

// A provider is a folder: providers/<kind>/ holds its adapter (the request mapped from Tropa's
// internal form, OpenAI's chat and embeddings, to the provider's; auth; the reply and the stream
// translated back into OpenAI's form; its errors). The pipeline sees only OpenAI-shaped replies,
// so the request lifecycle (reserve, route, relay, settle) is the same whatever the provider.

/** The adapters, one per provider kind; a call goes to its route's. */
export class ProviderRegistry implements UpstreamAdapter {
  private readonly adapters: Partial<Record<ProviderKind, UpstreamAdapter>>

  constructor(watchdog: Watchdog) {
    this.adapters = {
      openai: new OpenAICompatibleAdapter(watchdog),
      gemini: new GeminiAdapter(watchdog),
      azure: new AzureAdapter(watchdog),
      anthropic: new AnthropicAdapter(watchdog),
      gigachat: new GigaChatAdapter(watchdog),
      yandex: new YandexAdapter(watchdog),
    }
  }

  /** The kinds with an adapter in this build (config.load refuses the others). */
  supports(kind: ProviderKind): boolean {
    return this.adapters[kind] !== undefined
  }

  send(call: UpstreamCall, controller: AbortController, headersDeadlineMs: number): Promise<UpstreamReply> {
    const adapter = this.adapters[call.route.provider]
    if (!adapter) throw new Error(`no adapter for provider ${call.route.provider}`)
    // The legacy endpoint is passed through only (pipeline/completions.ts sends it to openai routes).
    if (call.path === '/completions' && call.route.provider !== 'openai')
      throw new Error(`provider ${call.route.provider} has no /completions`)
    return adapter.send(call, controller, headersDeadlineMs)
  }
}
