import { mkdtempSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { baseEnv, freePort, spawnChild, tail } from './proc.ts'

/**
 * Time from spawning the executable on the embedded default (`--demo`, fresh data dir: first
 * start, with migrations, a generated admin token and the demo organization) to /health and to
 * /ready answering 200. Polled every millisecond; the process is spawned without a shell so
 * nothing but the executable is on the clock.
 */
export async function timeToReady(
  binary: string,
  dir: string,
  logDir: string,
  timeoutMs = 15_000,
): Promise<{ healthMs: number; readyMs: number }> {
  const dataDir = mkdtempSync(join(dir, 'ready-'))
  const port = freePort()
  const base = `http://127.0.0.1:${port}`
  const t0 = performance.now()
  const child = spawnChild({
    name: `ready-${port}`,
    cmd: [binary, '--demo', '--port', String(port), '--data-dir', dataDir],
    env: baseEnv(),
    cwd: dataDir,
    logDir,
    raw: true,
  })
  const until200 = async (path: string): Promise<number> => {
    while (performance.now() - t0 < timeoutMs) {
      if (child.proc.exitCode !== null) throw new Error(`tropa --demo exited: ${tail(child)}`)
      try {
        const res = await fetch(base + path)
        await res.arrayBuffer()
        if (res.status === 200) return performance.now() - t0
      } catch {
        // not listening yet
      }
      await Bun.sleep(1)
    }
    throw new Error(`tropa --demo: ${path} not 200 within ${timeoutMs} ms: ${tail(child)}`)
  }
  try {
    const [healthMs, readyMs] = await Promise.all([until200('/health'), until200('/ready')])
    return { healthMs, readyMs }
  } finally {
    await child.stop()
    rmSync(dataDir, { recursive: true, force: true })
  }
}

/** Spawn to exit of `tropa --version`: what starting the executable costs before Tropa's own work. */
export async function timeToVersion(binary: string): Promise<number> {
  const t0 = performance.now()
  const p = Bun.spawn([binary, '--version'], { stdout: 'ignore', stderr: 'ignore', env: baseEnv() })
  await p.exited
  return performance.now() - t0
}

export function median(values: readonly number[]): number {
  if (values.length === 0) return 0
  const s = [...values].sort((a, b) => a - b)
  const mid = Math.floor(s.length / 2)
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2
}
