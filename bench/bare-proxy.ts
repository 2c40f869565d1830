import { writeFileSync } from 'node:fs'

/**
 * The physical limit of a proxy hop in Bun: `Bun.serve` + `fetch`, forwarding bytes and nothing
 * else (no parsing, no auth, no accounting). `/<fleet>/v1/...` goes to the next node of that
 * fleet round-robin, so one process serves every fleet like Tropa does.
 *
 * Usage: bun bench/bare-proxy.ts <json Record<fleet, base URLs incl. /v1>> <out file>; writes
 * the port it listens on (127.0.0.1) to the out file, then runs until SIGTERM.
 */

/** Base URLs without their trailing /v1, by fleet, and a round-robin cursor each. */
interface Pool {
  origins: string[]
  next: number
}

function main(): void {
  const [routesText, out] = process.argv.slice(2)
  if (!routesText || !out) throw new Error('usage: bun bench/bare-proxy.ts <json routes> <out file>')
  const routes = JSON.parse(routesText) as Record<string, string[]>
  const pools = new Map<string, Pool>()
  for (const [fleet, urls] of Object.entries(routes))
    pools.set(fleet, { origins: urls.map((u) => u.replace(/\/v1\/?$/, '')), next: 0 })

  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    // Streams in the memory test sit idle between tokens for up to a few seconds.
    idleTimeout: 0,
    async fetch(req) {
      const url = req.url
      // req.url is absolute: skip "http://host:port" to the path, then the fleet segment.
      const pathAt = url.indexOf('/', url.indexOf('//') + 2)
      const fleetEnd = url.indexOf('/', pathAt + 1)
      const pool = fleetEnd > 0 ? pools.get(url.slice(pathAt + 1, fleetEnd)) : undefined
      if (!pool) return new Response('unknown fleet', { status: 404 })
      const origin = pool.origins[pool.next++ % pool.origins.length]!
      try {
        return await fetch(origin + url.slice(fleetEnd), {
          method: req.method,
          headers: req.headers,
          body: req.method === 'GET' ? null : await req.arrayBuffer(),
          signal: req.signal,
          decompress: false,
        })
      } catch (err) {
        // Quietly: a log line per failed request would slow a failing run down further.
        return new Response(`upstream: ${(err as Error).message}`, { status: 502 })
      }
    },
  })
  writeFileSync(out, String(server.port))
  const stop = () => {
    server.stop(true)
    process.exit(0)
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

if (import.meta.main) main()
