import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Subprocess } from 'bun'

/**
 * Child processes of a benchmark run: spawned with the open-files limit raised (10,000 streams
 * through a proxy need two sockets each), logs to files in the run directory (an unread pipe
 * would block a chatty child), and all stopped by pid when the run ends or is interrupted.
 */

/** File descriptors every child asks for; the hard limit may cap it (see `fdLimit`). */
export const WANTED_FDS = 65_536

/** Bun's fetch sends at most 256 requests at once unless told otherwise at process start. */
export const MAX_HTTP_REQUESTS = '65535'

export interface Child {
  readonly name: string
  readonly pid: number
  readonly log: string
  readonly proc: Subprocess
  /** SIGTERM, then SIGKILL after a grace period. */
  stop(): Promise<void>
}

const live = new Set<Child>()

export interface SpawnOptions {
  name: string
  cmd: string[]
  env: Record<string, string>
  cwd?: string
  logDir: string
  /** Exec the command itself, without the bash wrapper (for start-up timings). */
  raw?: boolean
}

/**
 * Starts `cmd` under `bash -c 'ulimit -n ...; exec ...'`: exec keeps the pid, so the pid read
 * from /proc for memory is the program's own.
 */
export function spawnChild(o: SpawnOptions): Child {
  const log = join(o.logDir, `${o.name}.log`)
  const script = `ulimit -n ${WANTED_FDS} 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$@"`
  const proc = Bun.spawn(o.raw ? o.cmd : ['bash', '-c', script, 'bench-child', ...o.cmd], {
    cwd: o.cwd,
    env: o.env,
    stdin: 'ignore',
    stdout: Bun.file(log),
    stderr: Bun.file(`${log}.err`),
  })
  const child: Child = {
    name: o.name,
    pid: proc.pid,
    log,
    proc,
    async stop() {
      live.delete(child)
      if (proc.exitCode !== null || proc.signalCode !== null) return
      proc.kill('SIGTERM')
      const exited = await Promise.race([proc.exited.then(() => true), Bun.sleep(3000).then(() => false)])
      if (!exited) {
        proc.kill('SIGKILL')
        await proc.exited
      }
    },
  }
  live.add(child)
  return child
}

/** Kills every child still running (on exit or Ctrl-C), by pid. */
export function killAll(): void {
  for (const c of live) {
    try {
      c.proc.kill('SIGKILL')
    } catch {
      // already gone
    }
  }
  live.clear()
}

/** A minimal environment: PATH and HOME, plus what the child needs. No TROPA_* leaks in. */
export function baseEnv(extra: Record<string, string> = {}): Record<string, string> {
  const env: Record<string, string> = {}
  for (const k of ['PATH', 'HOME', 'TMPDIR', 'LANG']) {
    const v = process.env[k]
    if (v !== undefined) env[k] = v
  }
  // Tropa in one process unless a benchmark asks for workers (server.workers defaults to the cores).
  return { ...env, BUN_CONFIG_MAX_HTTP_REQUESTS: MAX_HTTP_REQUESTS, TROPA_WORKERS: '1', ...extra }
}

/** Waits until `file` exists and is non-empty, or the child dies, or the timeout passes. */
export async function waitForFile(file: string, child: Child, timeoutMs: number): Promise<string> {
  const end = performance.now() + timeoutMs
  while (performance.now() < end) {
    if (existsSync(file)) {
      const text = readFileSync(file, 'utf8')
      if (text.length > 0) return text
    }
    if (child.proc.exitCode !== null) throw new Error(`${child.name} exited: ${tail(child)}`)
    await Bun.sleep(20)
  }
  throw new Error(`${child.name} did not start within ${timeoutMs} ms: ${tail(child)}`)
}

/** Polls `url` until it answers `status` (any status when undefined). */
export async function waitForHttp(
  url: string,
  child: Child,
  timeoutMs: number,
  status?: number,
): Promise<void> {
  const end = performance.now() + timeoutMs
  while (performance.now() < end) {
    if (child.proc.exitCode !== null) throw new Error(`${child.name} exited: ${tail(child)}`)
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1000) })
      await res.arrayBuffer()
      if (status === undefined || res.status === status) return
    } catch {
      // not listening yet
    }
    await Bun.sleep(20)
  }
  throw new Error(`${child.name} did not answer ${url} within ${timeoutMs} ms: ${tail(child)}`)
}

/** The last lines a child wrote, for error messages. */
export function tail(child: Child, chars = 600): string {
  let text = ''
  for (const f of [child.log, `${child.log}.err`]) {
    if (existsSync(f)) text += readFileSync(f, 'utf8')
  }
  return text.slice(-chars).trim() || '(no output)'
}

/** A port free right now on 127.0.0.1 (for programs that must be told their port). */
export function freePort(): number {
  const s = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const port = s.port
  s.stop(true)
  return port
}

export interface Memory {
  /** Resident set now, KiB. */
  rssKiB: number
  /** Peak resident set over the process's life, KiB. */
  hwmKiB: number
}

/** VmRSS and VmHWM from /proc/<pid>/status; undefined when the process is gone. */
export function memoryOf(pid: number): Memory | undefined {
  let text: string
  try {
    text = readFileSync(`/proc/${pid}/status`, 'utf8')
  } catch {
    return undefined
  }
  const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0)
  return { rssKiB: kib('VmRSS'), hwmKiB: kib('VmHWM') }
}

/** The open-files limit children get: the wanted one, or the hard limit when that is lower. */
export async function fdLimit(): Promise<number> {
  const p = Bun.spawn(
    ['bash', '-c', `ulimit -n ${WANTED_FDS} 2>/dev/null || ulimit -n "$(ulimit -Hn)"; ulimit -n`],
    {
      stdout: 'pipe',
      stderr: 'ignore',
    },
  )
  const text = await new Response(p.stdout).text()
  await p.exited
  const t = text.trim()
  if (t === 'unlimited') return WANTED_FDS
  const n = Number(t)
  return Number.isFinite(n) ? n : 1024
}

/** CPU time a process has used (all its threads, or one), user + system, in microseconds. */
export function cpuUs(pid: number, thread?: number): number {
  // Fields after the command name: utime and stime are the 12th and 13th (clock ticks, 100/s).
  const stat = readFileSync(
    thread === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${thread}/stat`,
    'utf8',
  )
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return (Number(f[11]) + Number(f[12])) * 10_000
}
