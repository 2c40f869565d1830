import { UpstreamTimeout, UpstreamUnreachable } from '../errors.ts'

/**
 * Opens and closes one TCP connection to a node within `timeoutMs`. Bun's fetch has no separate
 * connect phase to time out, so a node that swallows connection attempts would otherwise hold a
 * request until the first-byte deadline; the pipeline probes a node first when it is not known
 * to be answering (never used yet, or failing).
 */
export function probeConnect(baseUrl: string, node: string, timeoutMs: number): Promise<void> {
  const u = new URL(baseUrl)
  const port = Number(u.port || (u.protocol === 'https:' ? 443 : 80))
  return new Promise<void>((resolve, reject) => {
    let settled = false
    const done = (err?: Error) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      if (err) reject(err)
      else resolve()
    }
    const timer = setTimeout(
      () => done(new UpstreamTimeout(`upstream node ${node} did not accept a connection in time`)),
      timeoutMs,
    )
    Bun.connect({
      hostname: u.hostname,
      port,
      socket: {
        open(socket) {
          socket.end()
          done()
        },
        data() {},
        connectError(_socket, err) {
          done(new UpstreamUnreachable(node, err.message))
        },
        error(_socket, err) {
          done(new UpstreamUnreachable(node, err.message))
        },
      },
    }).catch((err: Error) => done(new UpstreamUnreachable(node, err.message)))
  })
}
