import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { type Config, ConfigError, checkModel, type ModelConfig } from './config/load.ts'
import type { ModelFile } from './config/schema.ts'
import type { Services } from './services.ts'
import { type SimNode, startSimFleet } from './simulator/index.ts'
import { ANTHROPIC_SIM_KEY } from './simulator/protocols/anthropic.ts'
import { SIM_AZURE_API_KEY } from './simulator/protocols/azure.ts'
import type { SimProtocol } from './simulator/protocols/index.ts'

type RouteFile = NonNullable<ModelFile['routes']>[number]

/** One simulated node per provider protocol, serving one model each through its native adapter. */
const PROVIDER_NODES = [
  'anthropic',
  'gemini',
  'azure',
  'gigachat',
  'yandex',
] as const satisfies readonly SimProtocol[]

/** The demo's credentials for the simulated providers (they accept these, and only these shapes). */
export const DEMO_ENV = { GIGACHAT_SIM_AUTH_KEY: btoa('sim:secret'), YANDEX_SIM_KEY: 'AQVNsimkey' }

/**
 * The demo fleet, in this process: `n` OpenAI-compatible nodes serving the sim/ models, and one
 * node per provider protocol (Anthropic, Gemini, Azure OpenAI, GigaChat, YandexGPT).
 */
export async function startDemoFleet(n: number): Promise<{ nodes: SimNode[]; stop(): Promise<void> }> {
  return startSimFleet([
    ...Array.from({ length: n }, (_, i) => ({
      name: `sim-${i + 1}`,
      // A mildly heterogeneous fleet, so routing has something to do. Each reports a KV cache of
      // its own size, as different accelerators do: routing prices a node by a measured node
      // whose cache is the same size until it has measured the node itself (docs/routing.md).
      prefillTokensPerSec: 8000 - i * 1500,
      itlMs: 15 + i * 5,
      cacheBlocks: 4096 + i * 512,
      seed: i,
    })),
    ...PROVIDER_NODES.map((protocol, i) => ({
      name: `${protocol}-sim`,
      protocol,
      prefillTokensPerSec: 8000,
      itlMs: 15,
      seed: 100 + i,
    })),
  ])
}

export function demoModels(nodes: readonly SimNode[]): ModelConfig[] {
  const problems: string[] = []
  const models = demoModelFiles(nodes).map((f) => checkModel(f, `demo: ${f.id}`, DEMO_ENV, problems))
  if (problems.length > 0) throw new ConfigError(problems)
  return models
}

/**
 * The demo's models as a config file would write them (`models = [...]`); the provider ones
 * read their credentials from DEMO_ENV's variables.
 */
export function demoModelFiles(nodes: readonly Pick<SimNode, 'name' | 'url'>[]): ModelFile[] {
  const openai = nodes.filter((n) => n.name.startsWith('sim-'))
  const routes = (upstream: string) =>
    openai.map((n) => ({ name: n.name, base_url: n.url, upstream_model: upstream, max_concurrency: 64 }))
  const origin = (protocol: SimProtocol) => {
    const node = nodes.find((n) => n.name === `${protocol}-sim`)
    return node ? new URL(node.url).origin : undefined
  }
  const chat = (id: string, price: { prompt: string; completion: string }, route: RouteFile): ModelFile => ({
    id,
    kind: 'chat',
    context_length: 8192,
    max_output_tokens: 2048,
    pricing_per_million: price,
    // A hosted API bills per request: no hedged copies.
    routes: [{ billed_per_request: true, max_concurrency: 64, ...route }],
  })
  const files: ModelFile[] = [
    {
      id: 'sim/chat-small',
      owned_by: 'sim',
      kind: 'chat',
      context_length: 8192,
      pricing_per_million: { prompt: '30', completion: '60' },
      routes: routes('chat-small'),
    },
    {
      id: 'sim/embed-small',
      owned_by: 'sim',
      kind: 'embedding',
      context_length: 8192,
      dimensions: 256,
      pricing_per_million: { prompt: '2', completion: '0' },
      routes: routes('embed-small'),
    },
  ]
  // One model per provider protocol, served by that protocol's node through its native adapter.
  const providerModels: [
    SimProtocol,
    string,
    { prompt: string; completion: string },
    (at: string) => RouteFile,
  ][] = [
    [
      'anthropic',
      'anthropic/claude-sim',
      { prompt: '300', completion: '1500' },
      (at) => ({
        provider: 'anthropic',
        base_url: at,
        upstream_model: 'claude-sim',
        headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
      }),
    ],
    [
      'gemini',
      'google/gemini-sim',
      { prompt: '30', completion: '250' },
      (at) => ({
        provider: 'gemini',
        base_url: at,
        upstream_model: 'gemini-2.5-flash',
        headers: { 'x-goog-api-key': 'AIzaSyDemo-sim-key-0000000000000000000' },
      }),
    ],
    [
      'azure',
      'azure/gpt-4o-sim',
      { prompt: '250', completion: '1000' },
      (at) => ({
        provider: 'azure',
        base_url: at,
        upstream_model: 'gpt-4o-sim',
        api_version: '2024-10-21',
        headers: { 'api-key': SIM_AZURE_API_KEY },
      }),
    ],
    [
      'gigachat',
      'gigachat/gigachat-sim',
      { prompt: '30', completion: '60' },
      (at) => ({
        provider: 'gigachat',
        base_url: `${at}/api/v1`,
        auth_url: `${at}/api/v2/oauth`,
        api_key_env: 'GIGACHAT_SIM_AUTH_KEY',
        upstream_model: 'GigaChat',
      }),
    ],
    [
      'yandex',
      'yandex/yandexgpt-sim',
      { prompt: '30', completion: '60' },
      (at) => ({
        provider: 'yandex',
        base_url: at,
        folder_id: 'b1gdemo',
        api_key_env: 'YANDEX_SIM_KEY',
        upstream_model: 'yandexgpt/latest',
      }),
    ],
  ]
  for (const [protocol, id, price, route] of providerModels) {
    const at = origin(protocol)
    if (at) files.push(chat(id, price, { name: `${protocol}-sim`, ...route(at) }))
  }
  return files
}

export interface DemoCredentials {
  base_url: string
  admin_token: string
  master_key: string
  api_key: string
}

/**
 * Makes sure the demo organization exists with a master key and an API key, reusing those in
 * demo-credentials.json when they still work (secrets are stored hashed, so the file is the
 * only place they can be read again).
 */
export async function ensureDemoOrg(svc: Services, cfg: Config, baseUrl: string, adminToken: string) {
  const file = join(cfg.server.dataDir, 'demo-credentials.json')
  let saved: Partial<DemoCredentials> = {}
  if (existsSync(file)) {
    try {
      saved = JSON.parse(readFileSync(file, 'utf8')) as Partial<DemoCredentials>
    } catch {
      saved = {}
    }
  }
  const works = (secret: string | undefined) => {
    if (!secret) return false
    try {
      svc.identity.authenticate(`Bearer ${secret}`)
      return true
    } catch {
      return false
    }
  }
  let org = await svc.identity.findOrgByName('demo')
  if (!org) {
    org = await svc.identity.createOrg('demo')
    await svc.identity.credit(org, cfg.demo.balanceNano)
  }
  const master = works(saved.master_key)
    ? saved.master_key!
    : (await svc.identity.createKey(org, 'master', { name: 'demo master', limitNano: null })).secret
  const api = works(saved.api_key)
    ? saved.api_key!
    : (await svc.identity.createKey(org, 'api', { name: 'demo', limitNano: null })).secret
  const creds: DemoCredentials = {
    base_url: baseUrl,
    admin_token: adminToken,
    master_key: master,
    api_key: api,
  }
  writeFileSync(file, `${JSON.stringify(creds, null, 2)}\n`, { mode: 0o600 })
  chmodSync(file, 0o600)
  return { creds, file }
}
