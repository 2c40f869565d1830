import type { RouteConfig } from '../../../config/load.ts'
import type { UpstreamAdapter, UpstreamCall, UpstreamReply } from '../../adapter.ts'
import type { Watchdog } from '../../watchdog.ts'
import { sendHttp } from '../http.ts'

/**
 * Azure OpenAI: OpenAI's body and replies (streams too) behind Azure's own addressing. The route's
 * upstream_model names the deployment; its api_version goes into the query; the key goes in the
 * `api-key` header. Nothing is parsed: the body goes as built (Azure ignores its `model`) and the
 * reply comes back as it is, prompt_filter_results and content_filter finish reasons included.
 * Errors are OpenAI-shaped: 400 is the client's, cleaned; 401/403/404 (a missing deployment),
 * 429 and 5xx fail the node over (classifyStatus's defaults).
 */
export class AzureAdapter implements UpstreamAdapter {
  /** Each route's two URLs, built once (a route's config does not change while it lives). */
  private readonly urls = new WeakMap<RouteConfig, { chat: string; embeddings: string }>()

  constructor(private readonly watchdog: Watchdog) {}

  send(call: UpstreamCall, controller: AbortController, headersDeadlineMs: number): Promise<UpstreamReply> {
    const route = call.route
    const headers: Record<string, string> = {
      ...route.headers,
      'content-type': 'application/json',
      accept: call.stream ? 'text/event-stream' : 'application/json',
    }
    if (route.apiKey) headers['api-key'] = route.apiKey
    let urls = this.urls.get(route)
    if (!urls) {
      urls = { chat: azureUrl(route, '/chat/completions'), embeddings: azureUrl(route, '/embeddings') }
      this.urls.set(route, urls)
    }
    return sendHttp(
      call,
      { url: call.path === '/embeddings' ? urls.embeddings : urls.chat, headers, body: call.body },
      controller,
      headersDeadlineMs,
      this.watchdog,
    )
  }
}

/** `<base_url>/openai/deployments/<deployment><path>?api-version=<api_version>`. */
export function azureUrl(
  route: Pick<RouteConfig, 'baseUrl' | 'upstreamModel' | 'apiVersion'>,
  path: string,
): string {
  return `${route.baseUrl}/openai/deployments/${encodeURIComponent(route.upstreamModel)}${path}?api-version=${encodeURIComponent(route.apiVersion ?? '')}`
}
