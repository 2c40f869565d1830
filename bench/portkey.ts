import { existsSync, readFileSync } from 'node:fs'
import { join, resolve } from 'node:path'

/**
 * Portkey's open-source AI gateway, the comparison point: installed from npm into a throw-away
 * folder (.bench/ is gitignored), run with Bun like the other contestants.
 */

export const PORTKEY_PACKAGE = '@portkey-ai/gateway'
export const PORTKEY_VERSION = '1.15.2'

/** The server entry point inside an install folder. */
export function portkeyEntry(dir: string): string {
  return join(dir, 'node_modules', PORTKEY_PACKAGE, 'build', 'start-server.js')
}

/**
 * Makes sure the pinned gateway is installed under `dir`; returns why not when it cannot be.
 * Install scripts are skipped: the only one runs patch-package on a dev checkout, and the built
 * server needs none of it.
 */
export async function ensurePortkey(dir: string): Promise<{ ok: true } | { ok: false; reason: string }> {
  const manifest = join(dir, 'node_modules', PORTKEY_PACKAGE, 'package.json')
  if (existsSync(manifest) && existsSync(portkeyEntry(dir))) {
    const { version } = JSON.parse(readFileSync(manifest, 'utf8')) as { version?: string }
    if (version === PORTKEY_VERSION) return { ok: true }
  }
  if (!Bun.which('npm')) return { ok: false, reason: 'npm is not installed' }
  const proc = Bun.spawn(
    [
      'npm',
      'install',
      '--prefix',
      resolve(dir),
      '--no-audit',
      '--no-fund',
      '--omit=dev',
      '--ignore-scripts',
      '--no-save',
      `${PORTKEY_PACKAGE}@${PORTKEY_VERSION}`,
    ],
    { stdout: 'pipe', stderr: 'pipe', env: { ...process.env, npm_config_loglevel: 'error' } },
  )
  const timer = setTimeout(() => proc.kill('SIGKILL'), 180_000)
  const [, err] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text()])
  const code = await proc.exited
  clearTimeout(timer)
  if (code !== 0 || !existsSync(portkeyEntry(dir)))
    return { ok: false, reason: `npm install failed (${code}): ${err.trim().slice(-300)}` }
  return { ok: true }
}

/** The x-portkey-config header that spreads requests over `nodes` (base URLs including /v1). */
export function portkeyConfig(nodes: readonly string[]): string {
  return JSON.stringify({
    strategy: { mode: 'loadbalance' },
    targets: nodes.map((n) => ({ provider: 'openai', api_key: 'k', custom_host: n, weight: 1 })),
  })
}

/** The command line: production mode (no UI, no log streaming), headless, on 127.0.0.1. */
export function portkeyCommand(dir: string, port: number): { cmd: string[]; env: Record<string, string> } {
  return {
    cmd: [
      process.execPath,
      '--preload',
      resolve(import.meta.dir, 'portkey-loopback.ts'),
      portkeyEntry(dir),
      `--port=${port}`,
      '--headless',
    ],
    env: { NODE_ENV: 'production' },
  }
}
