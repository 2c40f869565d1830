import { expect } from 'bun:test'
import { costNano, formatRub, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { SimNode } from '../../src/simulator/index.ts'
import { ANTHROPIC_SIM_KEY } from '../../src/simulator/protocols/anthropic.ts'
import { SIM_AZURE_API_KEY } from '../../src/simulator/protocols/azure.ts'
import type { SimProtocol } from '../../src/simulator/protocols/index.ts'
import { loadTokenizer } from '../../src/tokenizer.ts'
import { usageRows } from './ledger.ts'
import { startTropa, type Tropa } from './start.ts'

// The provider matrix: one Tropa in front of one simulated node per provider protocol, each
// serving one chat model through its native adapter (route shapes as in the demo and in
// test/providers/<kind>.test.ts). Each model has its own price, so a cost billed at the wrong
// model's price shows.

type Route = NonNullable<ModelFile['routes']>[number]

export interface Provider {
  kind: SimProtocol
  /** The catalogue model served by this provider's node (the node is named as the kind). */
  model: string
  /** Roubles per token, six digits. */
  pricing: { prompt: string; completion: string }
  route: (n: SimNode) => Omit<Route, 'name' | 'upstream_model'> & { upstream_model: string }
}

const origin = (n: SimNode) => new URL(n.url).origin

export const PROVIDERS: Provider[] = [
  {
    kind: 'openai',
    model: 'openai/chat-sim',
    pricing: { prompt: '0.000030', completion: '0.000060' },
    route: (n) => ({ base_url: n.url, upstream_model: 'chat-up' }),
  },
  {
    kind: 'azure',
    model: 'azure/gpt-4o-sim',
    pricing: { prompt: '0.000250', completion: '0.001000' },
    route: (n) => ({
      provider: 'azure',
      base_url: origin(n),
      upstream_model: 'gpt-4o-dep',
      api_version: '2024-10-21',
      api_key_env: 'AZURE_KEY',
      billed_per_request: true,
    }),
  },
  {
    kind: 'anthropic',
    model: 'anthropic/claude-sim',
    pricing: { prompt: '0.000300', completion: '0.001500' },
    route: (n) => ({
      provider: 'anthropic',
      base_url: origin(n),
      upstream_model: 'claude-sim',
      headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
      billed_per_request: true,
    }),
  },
  {
    kind: 'gemini',
    model: 'google/gemini-sim',
    pricing: { prompt: '0.000031', completion: '0.000250' },
    route: (n) => ({
      provider: 'gemini',
      base_url: origin(n),
      upstream_model: 'gemini-2.5-flash',
      headers: { 'x-goog-api-key': 'AIzaSyDsim-0123456789abcdefghijklmnopq' },
      billed_per_request: true,
    }),
  },
  {
    kind: 'gigachat',
    model: 'gigachat/gigachat-sim',
    pricing: { prompt: '0.000975', completion: '0.000977' },
    route: (n) => ({
      provider: 'gigachat',
      base_url: `${origin(n)}/api/v1`,
      auth_url: `${origin(n)}/api/v2/oauth`,
      api_key_env: 'GIGACHAT_KEY',
      upstream_model: 'GigaChat',
      billed_per_request: true,
    }),
  },
  {
    kind: 'yandex',
    model: 'yandex/yandexgpt-sim',
    pricing: { prompt: '0.001200', completion: '0.001201' },
    route: (n) => ({
      provider: 'yandex',
      base_url: origin(n),
      folder_id: 'b1gmatrix',
      api_key_env: 'YANDEX_KEY',
      upstream_model: 'yandexgpt/latest',
      billed_per_request: true,
    }),
  },
]

/** Rows for describe.each / test.each: [kind, provider]. */
export const EACH = PROVIDERS.map((p) => [p.kind, p] as const)

export const priceNano = (p: Provider) => ({
  promptNano: parseRub(p.pricing.prompt, 6)!,
  completionNano: parseRub(p.pricing.completion, 6)!,
})

/** One Tropa in front of one simulated node per provider protocol (nodes named as their kind). */
export async function startMatrix(): Promise<Tropa> {
  // Loaded before the first request, so that no cell's time goes to it.
  await loadTokenizer()
  return startTropa({
    nodes: PROVIDERS.map((p, i) => ({ name: p.kind, protocol: p.kind, timeScale: 0, seed: i + 1 })),
    models: (nodes) =>
      PROVIDERS.map((p) => {
        const node = nodes.find((n) => n.name === p.kind)!
        return {
          id: p.model,
          kind: 'chat' as const,
          context_length: 8192,
          max_output_tokens: 2048,
          pricing: p.pricing,
          routes: [{ name: node.name, max_concurrency: 64, ...p.route(node) }],
        }
      }),
    env: { AZURE_KEY: SIM_AZURE_API_KEY, GIGACHAT_KEY: btoa('matrix:secret'), YANDEX_KEY: 'AQVNmatrixkey' },
  })
}

export interface Tokens {
  prompt: number
  completion: number
}

/** The tokens a provider's node counted since the last take(): what it would bill. */
export function meter(t: Tropa, p: Provider) {
  const node = t.nodes.find((n) => n.name === p.kind)!
  const now = () => ({ prompt: node.stats().promptTokens, completion: node.stats().completionTokens })
  let last = now()
  return {
    take(): Tokens {
      const n = now()
      const d = { prompt: n.prompt - last.prompt, completion: n.completion - last.completion }
      last = n
      return d
    },
  }
}

/**
 * The billing of one request is exact: the usage the client saw is the node's own count, the
 * cost it saw (`cost_rub`, and the header when there is one) is that usage at the model's price,
 * and the ledger holds one row for the request at that cost with the node's counts.
 */
export async function expectBilled(
  t: Tropa,
  p: Provider,
  requestId: string,
  seen: Tokens & { costRub: number | undefined; header?: string | null },
  node: Tokens,
) {
  expect(node.completion).toBeGreaterThan(0)
  expect({ prompt: seen.prompt, completion: seen.completion }).toEqual(node)
  const cost = costNano(node.prompt, node.completion, priceNano(p))
  expect(seen.costRub).toBe(nanoToRubNumber(cost))
  if (seen.header !== undefined) expect(seen.header).toBe(formatRub(cost))
  const rows = (await usageRows(t)).filter((r) => r.requestId === requestId)
  expect(rows).toHaveLength(1)
  expect(rows[0]).toMatchObject({
    model: p.model,
    node: p.kind,
    promptTokens: node.prompt,
    completionTokens: node.completion,
    costNano: cost,
    estimated: false,
    outcome: 'ok',
    batchId: null,
  })
}

/** The JSON Schema of the one function tool every cell offers. */
export const WEATHER_PARAMS = {
  type: 'object',
  properties: { city: { type: 'string' } },
  required: ['city'],
}
