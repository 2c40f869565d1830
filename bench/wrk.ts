import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

/**
 * Raw throughput with wrk (closed loop, C connections, keep-alive), for the rates where a Bun
 * client would be the bottleneck itself. The POST body and headers go in a Lua script written to
 * a temp dir; its done() prints the figures as one JSON line, with p99.9 (wrk's --latency stops
 * at p99).
 */

export interface WrkResult {
  requests: number
  rps: number
  /** Non-2xx answers plus socket errors and timeouts. */
  errors: number
  p50: number
  p99: number
  p999: number
  connections: number
  durationS: number
}

export interface WrkOptions {
  url: string
  headers: Record<string, string>
  body: string
  connections: number
  threads: number
  durationS: number
}

/** The wrk executable, or undefined when it is not installed (CI): wrk rows are then skipped. */
export function wrkPath(): string | undefined {
  return Bun.which('wrk') ?? undefined
}

/** A Lua long string that cannot be closed early by the text inside it. */
export function luaString(text: string): string {
  let eq = ''
  while (text.includes(`]${eq}]`)) eq += '='
  return `[${eq}[${text}]${eq}]`
}

export function wrkScript(headers: Record<string, string>, body: string): string {
  const lines = ['wrk.method = "POST"', `wrk.body = ${luaString(body)}`]
  lines.push(`wrk.headers["Content-Type"] = "application/json"`)
  // The spaces matter: `t[[[k]]]` would open a long string at `[[`.
  for (const [k, v] of Object.entries(headers)) lines.push(`wrk.headers[ ${luaString(k)} ] = ${luaString(v)}`)
  lines.push(
    'done = function(summary, latency, requests)',
    '  local e = summary.errors',
    '  io.write(string.format("WRK_JSON {\\"requests\\":%d,\\"duration_us\\":%d,\\"errors\\":%d,\\"p50\\":%d,\\"p99\\":%d,\\"p999\\":%d}\\n",',
    '    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,',
    '    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))',
    'end',
  )
  return `${lines.join('\n')}\n`
}

/** Parses the line written by the script's done(). Latencies come back in ms. */
export function parseWrkOutput(stdout: string, connections: number, durationS: number): WrkResult {
  const line = stdout.split('\n').find((l) => l.startsWith('WRK_JSON '))
  if (!line) throw new Error(`wrk printed no summary: ${stdout.slice(-400)}`)
  const j = JSON.parse(line.slice('WRK_JSON '.length)) as {
    requests: number
    duration_us: number
    errors: number
    p50: number
    p99: number
    p999: number
  }
  return {
    requests: j.requests,
    rps: j.requests / (j.duration_us / 1e6),
    errors: j.errors,
    p50: j.p50 / 1000,
    p99: j.p99 / 1000,
    p999: j.p999 / 1000,
    connections,
    durationS,
  }
}

export async function runWrk(o: WrkOptions): Promise<WrkResult> {
  const wrk = wrkPath()
  if (!wrk) throw new Error('wrk is not installed')
  const dir = mkdtempSync(join(tmpdir(), 'tropa-bench-wrk-'))
  try {
    const script = join(dir, 'post.lua')
    writeFileSync(script, wrkScript(o.headers, o.body))
    const proc = Bun.spawn(
      [
        wrk,
        `-t${o.threads}`,
        `-c${o.connections}`,
        `-d${o.durationS}s`,
        '--timeout',
        '5s',
        '-s',
        script,
        o.url,
      ],
      { stdout: 'pipe', stderr: 'pipe' },
    )
    const timer = setTimeout(() => proc.kill('SIGKILL'), (o.durationS + 15) * 1000)
    const [out, err] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text()])
    await proc.exited
    clearTimeout(timer)
    return parseWrkOutput(`${out}\n${err}`, o.connections, o.durationS)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
