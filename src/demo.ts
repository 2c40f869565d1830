import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { type Config, ConfigError, checkModel, type ModelConfig } from './config/load.ts'
import type { Services } from './services.ts'
import { type SimNode, startSimFleet } from './simulator/index.ts'

/** The demo fleet: simulated nodes in this process, one chat and one embedding model on all of them. */
export async function startDemoFleet(n: number): Promise<{ nodes: SimNode[]; stop(): Promise<void> }> {
  return startSimFleet(
    Array.from({ length: n }, (_, i) => ({
      name: `sim-${i + 1}`,
      // A mildly heterogeneous fleet, so routing has something to do.
      prefillTokensPerSec: 8000 - i * 1500,
      itlMs: 15 + i * 5,
      seed: i,
    })),
  )
}

export function demoModels(nodes: readonly SimNode[]): ModelConfig[] {
  const problems: string[] = []
  const routes = (upstream: string) =>
    nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: upstream, max_concurrency: 64 }))
  const models = [
    checkModel(
      {
        id: 'sim/chat-small',
        owned_by: 'sim',
        kind: 'chat',
        context_length: 8192,
        pricing_per_million: { prompt: '30', completion: '60' },
        routes: routes('chat-small'),
      },
      'demo: sim/chat-small',
      {},
      problems,
    ),
    checkModel(
      {
        id: 'sim/embed-small',
        owned_by: 'sim',
        kind: 'embedding',
        context_length: 8192,
        dimensions: 256,
        pricing_per_million: { prompt: '2', completion: '0' },
        routes: routes('embed-small'),
      },
      'demo: sim/embed-small',
      {},
      problems,
    ),
  ]
  if (problems.length > 0) throw new ConfigError(problems)
  return models
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
