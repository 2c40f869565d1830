import { afterEach, describe, expect, test } from 'bun:test'
import { costNano, parseRub } from '../../src/billing/money.ts'
import type { ModelFile, ProviderKind } from '../../src/config/schema.ts'
import type { SimNode } from '../../src/simulator/index.ts'
import { ANTHROPIC_SIM_KEY } from '../../src/simulator/protocols/anthropic.ts'
import { SIM_AZURE_API_KEY } from '../../src/simulator/protocols/azure.ts'
import { usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// A simulated node of any protocol with the `hang` fault takes the request and never answers
// (its token exchange included): the route's first-byte deadline fails it over to the other
// node of the model, and the request is billed once, at what the node that answered counted.

const PRICE = {
  promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
  completionNano: parseRub(CHAT_PRICE.completion, 6)!,
}
const MODEL = 'hang/chat'
const env = {
  AZURE_KEY: SIM_AZURE_API_KEY,
  GIGACHAT_KEY: btoa('tropa-client:tropa-secret'),
  YANDEX_KEY: 'AQVNsim-yandex-api-key',
}

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

type Route = NonNullable<ModelFile['routes']>[number]

/** A route to a simulated node of `kind`, as each provider's own test file writes it. */
function route(kind: ProviderKind, n: SimNode): Route {
  const origin = new URL(n.url).origin
  const common = { name: n.name, provider: kind, hedge: false, max_concurrency: 16 }
  switch (kind) {
    case 'anthropic':
      return {
        ...common,
        base_url: origin,
        upstream_model: 'claude-up',
        headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
      }
    case 'gemini':
      return {
        ...common,
        base_url: origin,
        upstream_model: 'gemini-2.5-flash',
        headers: { 'x-goog-api-key': 'AIzaSyDsim-0123456789abcdefghijklmnopq' },
      }
    case 'azure':
      return {
        ...common,
        base_url: origin,
        upstream_model: 'gpt-dep',
        api_version: '2024-10-21',
        api_key_env: 'AZURE_KEY',
      }
    case 'gigachat':
      return {
        ...common,
        base_url: `${origin}/api/v1`,
        auth_url: `${origin}/api/v2/oauth`,
        api_key_env: 'GIGACHAT_KEY',
        upstream_model: 'GigaChat',
      }
    case 'yandex':
      return {
        ...common,
        base_url: origin,
        folder_id: 'b1gtropatest',
        api_key_env: 'YANDEX_KEY',
        upstream_model: 'yandexgpt-lite',
      }
    default:
      return { ...common, base_url: n.url, upstream_model: 'chat-up' }
  }
}

async function hungFailsOver(kind: ProviderKind) {
  t = await startTropa({
    nodes: [
      { name: 'hung', protocol: kind, timeScale: 0, seed: 1, faults: { hang: true } },
      { name: 'good', protocol: kind, timeScale: 0, seed: 2 },
    ],
    models: (nodes): ModelFile[] => [
      {
        id: MODEL,
        kind: 'chat',
        context_length: 8192,
        pricing: CHAT_PRICE,
        // The hung node is the router's first choice.
        routes: nodes.map((n) => ({ ...route(kind, n), weight: n.name === 'hung' ? 1000 : 1 })),
      },
    ],
    env,
    upstream: { first_byte_timeout_ms: 300 },
  })
  const [hung, good] = t.nodes
  for (const stream of [false, true]) {
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({
        model: MODEL,
        max_tokens: 6,
        stream,
        ...(stream && { stream_options: { include_usage: true } }),
        messages: [{ role: 'user', content: 'hi' }],
      }),
    })
    expect(res.status).toBe(200)
    expect(res.headers.get('x-tropa-node')).toBe('good')
    const text = await res.text()
    expect(text).toContain(stream ? 'data: [DONE]' : '"finish_reason"')
  }
  // The hung node took requests and was left by each. On gigachat it is the token exchange that
  // hangs: one, shared by both requests, which goes on after they have left (until its own 10 s).
  if (kind === 'gigachat') {
    expect(hung!.stats().requests).toBe(1)
    expect(hung!.stats().authRequests).toBe(0)
  } else {
    expect(hung!.stats().requests).toBe(2)
    for (let i = 0; i < 50 && hung!.stats().aborted < 2; i++) await Bun.sleep(20)
    expect(hung!.stats().aborted).toBe(2)
  }
  expect(hung!.stats().chatRequests).toBe(0)
  // Billed once per request, at the answering node's own counts.
  const s = good!.stats()
  expect(s.chatRequests).toBe(2)
  const rows = await usageRows(t)
  expect(rows).toHaveLength(2)
  const billed = rows.reduce((a, r) => a + r.costNano, 0n)
  expect(billed).toBe(costNano(s.promptTokens, s.completionTokens, PRICE))
  expect(rows.every((r) => !r.estimated && r.outcome === 'ok')).toBe(true)
}

describe('a hung node of a provider protocol fails over under the first-byte deadline, billed once', () => {
  for (const kind of ['anthropic', 'gemini', 'azure', 'gigachat', 'yandex'] as const)
    test(kind, () => hungFailsOver(kind), 30_000)
})
