import { join } from 'node:path'

/** Tropa as a separate process from the sources (so a test can kill -9 it), ready when /ready answers. */
export async function startRouterProcess(configPath: string, port: number, env: Record<string, string> = {}) {
  const proc = Bun.spawn(
    [
      process.execPath,
      // The runtime's header limit as package.json's scripts and the executable set it (app.ts).
      '--max-http-header-size=65536',
      join(import.meta.dir, '../../src/main.ts'),
      '--config',
      configPath,
      '--port',
      String(port),
    ],
    // One process unless the test asks for more (server.workers defaults to the cores).
    { stdout: 'ignore', stderr: 'pipe', env: { PATH: process.env.PATH ?? '', TROPA_WORKERS: '1', ...env } },
  )
  const url = `http://127.0.0.1:${port}`
  for (let i = 0; i < 500; i++) {
    try {
      if ((await fetch(`${url}/ready`)).ok) return { proc, url }
    } catch {}
    await Bun.sleep(10)
  }
  throw new Error(`router did not start: ${await new Response(proc.stderr).text()}`)
}

/** A request with a bearer token and an optional JSON body, answered as JSON. */
export const jsonCall = (url: string, path: string, token: string, body?: unknown) =>
  fetch(`${url}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  }).then((r) => r.json() as Promise<Record<string, unknown>>)

/** A port that is free right now (the OS picks it; the tiny race with other listeners is acceptable in tests). */
export function freePort(): number {
  const s = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response() })
  const port = s.port!
  s.stop(true)
  return port
}
