// A Tropa for the fuzzer: its own process (so its memory and its log are its own) on a fresh
// SQLite data directory, in front of three simulated nodes (another process) that answer at once, with an
// organization holding plenty of money. After the run, the store is read directly.
import { Database } from 'bun:sqlite'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort, jsonCall, startRouterProcess } from '../../test/helpers/process.ts'
import { startSimProcess } from '../../test/helpers/sim-process.ts'
import { ADMIN_TOKEN, defaultModels } from '../../test/helpers/start.ts'
import type { Secrets, Target } from './gen.ts'

export const FUZZ_BALANCE_NANO = 1_000_000n * 1_000_000_000n

export interface FuzzTarget {
  url: string
  pid: number
  orgId: string
  apiKeyId: string
  secrets: Secrets
  target: Target
  /** The router's resident memory now, in bytes (VmRSS). */
  rss(): number
  /** Stops the router (SIGTERM: it flushes the ledger) and returns what it wrote to stderr. */
  stop(): Promise<string>
  /** After stop(): the store's ledger rows of the organization, and its balance. */
  ledger(): { usage: Map<string, bigint>; credits: bigint; balanceNano: bigint }
  cleanup(): Promise<void>
}

export async function startFuzzTarget(): Promise<FuzzTarget> {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-fuzz-'))
  // The simulated nodes run in a process of their own: their work is not the router's latency.
  const fleet = await startSimProcess(
    [1, 2, 3].map((i) => ({ name: `sim-${i}`, seed: i, itlMs: 0, prefillTokensPerSec: 10_000_000 })),
  )
  const config = join(dir, 'tropa.json')
  writeFileSync(
    config,
    JSON.stringify({
      server: {
        data_dir: dir,
        admin_token: ADMIN_TOKEN,
        log_level: 'error',
        max_body_bytes: 4 * 1024 * 1024,
      },
      models: defaultModels(fleet.nodes),
    }),
  )
  const { proc, url } = await startRouterProcess(config, freePort())
  const org = await jsonCall(url, '/v1/admin/organizations', ADMIN_TOKEN, {
    name: 'fuzz',
    balance_rub: 1_000_000,
  })
  const key = await jsonCall(url, '/v1/keys', org.master_key as string, { name: 'fuzz' })
  // A key the fuzz may rename, disable or revoke through its id (its own must stay usable).
  const decoy = await jsonCall(url, '/v1/keys', org.master_key as string, { name: 'decoy' })
  let stderr = ''
  return {
    url,
    pid: proc.pid,
    orgId: org.id as string,
    apiKeyId: key.key_id as string,
    secrets: { api: key.key as string, master: org.master_key as string, admin: ADMIN_TOKEN },
    target: {
      chatModels: ['test/chat'],
      embeddingModels: ['test/embed'],
      ids: [org.id as string, decoy.key_id as string],
    },
    rss: () => {
      const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${proc.pid}/status`, 'utf8'))
      return Number(m?.[1] ?? 0) * 1024
    },
    stop: async () => {
      proc.kill('SIGTERM')
      await proc.exited
      stderr = await new Response(proc.stderr).text()
      return stderr
    },
    ledger: () => {
      const db = new Database(join(dir, 'tropa.db'), { readonly: true, safeIntegers: true })
      try {
        const usage = new Map<string, bigint>()
        for (const r of db
          .query("SELECT request_id, cost_nano FROM ledger WHERE org_id = ? AND kind = 'usage'")
          .all(org.id as string) as { request_id: string; cost_nano: bigint }[])
          usage.set(r.request_id, r.cost_nano)
        const credits = (
          db
            .query("SELECT COALESCE(SUM(cost_nano), 0) AS s FROM ledger WHERE org_id = ? AND kind = 'credit'")
            .get(org.id as string) as { s: bigint }
        ).s
        const balanceNano = (
          db.query('SELECT balance_nano FROM orgs WHERE id = ?').get(org.id as string) as {
            balance_nano: bigint
          }
        ).balance_nano
        return { usage, credits, balanceNano }
      } finally {
        db.close()
      }
    },
    cleanup: async () => {
      if (proc.exitCode === null) proc.kill('SIGKILL')
      await fleet.stop()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
