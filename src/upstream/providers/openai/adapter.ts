import type { UpstreamAdapter, UpstreamCall, UpstreamReply } from '../../adapter.ts'
import type { Watchdog } from '../../watchdog.ts'
import { sendHttp } from '../http.ts'

/**
 * vLLM, llama.cpp's server, Ollama, OpenAI and anything else speaking OpenAI's HTTP API: the
 * pass-through. The body goes as built and the reply comes back as it is; nothing is parsed here.
 */
export class OpenAICompatibleAdapter implements UpstreamAdapter {
  constructor(private readonly watchdog: Watchdog) {}

  send(call: UpstreamCall, controller: AbortController, headersDeadlineMs: number): Promise<UpstreamReply> {
    const headers: Record<string, string> = {
      ...call.route.headers,
      'content-type': 'application/json',
      accept: call.stream ? 'text/event-stream' : 'application/json',
    }
    if (call.route.apiKey) headers.authorization = `Bearer ${call.route.apiKey}`
    return sendHttp(
      call,
      { url: `${call.route.baseUrl}${call.path}`, headers, body: call.body },
      controller,
      headersDeadlineMs,
      this.watchdog,
    )
  }
}
