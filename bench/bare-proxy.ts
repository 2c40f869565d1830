import { writeFileSync } from 'node:fs'

/**
 * The physical limit of a proxy hop in Bun: `Bun.serve` + `fetch`, forwarding bytes and nothing
 * else (no parsing, no auth, no accounting). `/<fleet>/v1/...` goes to the next node of that
 * fleet round-robin, so one process serves every fleet like Tropa does.
 *
 * Usage: bun bench/bare-proxy.ts <json Record<fleet, base URLs incl. /v1>> <out file> [relay];
 * writes the port it listens on (127.0.0.1) to the out file, then runs until SIGTERM.
 *
 * `relay`: the floor of a proxy that reads the upstream's body in JavaScript (as any proxy that
 * looks at the events must): each chunk read with a reader and written to a direct stream, as
 * Tropa's relay does, with nothing else. Without it the fetch's body goes back as it is, and Bun
 * pipes it from socket to socket without JavaScript seeing a byte.
 *
 * `json`: the floor of a proxy that reads what it forwards as JSON, as a router must for a
 * non-streamed answer (usage, ids): the request's text parsed and written again, the answer's
 * text parsed, its id replaced, and a new Response of its JSON (a streamed request is relayed as
 * in `relay`).
 */

/** Base URLs without their trailing /v1, by fleet, and a round-robin cursor each. */
interface Pool {
  origins: string[]
  next: number
}

function main(): void {
  const [routesText, out, mode] = process.argv.slice(2)
  const relay = mode === 'relay' || mode === 'json'
  const json = mode === 'json'
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
        if (json && req.method === 'POST') return await rewritten(req, origin + url.slice(fleetEnd))
        const res = await fetch(origin + url.slice(fleetEnd), {
          method: req.method,
          headers: req.headers,
          body: req.method === 'GET' ? null : await req.arrayBuffer(),
          signal: req.signal,
          decompress: false,
        })
        return relay && res.body ? new Response(relayed(res.body), res) : res
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

/** `json`: the request and the answer parsed and written again (a stream is relayed). */
async function rewritten(req: Request, target: string): Promise<Response> {
  const body = JSON.parse(await req.text()) as { stream?: boolean }
  const res = await fetch(target, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: req.headers.get('authorization') ?? '' },
    body: JSON.stringify(body),
    signal: req.signal,
    decompress: false,
  })
  if (body.stream === true || !res.ok || !res.body)
    return res.body ? new Response(relayed(res.body), res) : res
  const answer = JSON.parse(await res.text()) as { id?: string }
  answer.id = 'chatcmpl-bare'
  return new Response(JSON.stringify(answer), {
    status: res.status,
    headers: { 'content-type': 'application/json' },
  })
}

/** The body read chunk by chunk in JavaScript and written to a direct stream, one flush a chunk. */
function relayed(body: ReadableStream<Uint8Array>): ReadableStream<Uint8Array> {
  const reader = body.getReader()
  const source: Bun.DirectUnderlyingSource<Uint8Array> = {
    type: 'direct',
    async pull(controller) {
      try {
        for (;;) {
          const { done, value } = await reader.read()
          if (done) return void controller.close()
          controller.write(value)
          controller.flush()
        }
      } catch {
        controller.close()
      }
    },
    cancel: () => void reader.cancel().catch(() => {}),
  }
  return new ReadableStream<Uint8Array>(source as unknown as UnderlyingDefaultSource<Uint8Array>)
}

if (import.meta.main) main()
