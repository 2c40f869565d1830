import { expect, test } from 'bun:test'
import { UpstreamFailed } from '../../src/errors.ts'
import { probeConnect } from '../../src/upstream/connect-probe.ts'

test('a listening node passes the probe; a closed port fails it at once as a node failure', async () => {
  const server = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  await probeConnect(`http://127.0.0.1:${server.port}/v1`, 'up', 1000)
  const port = server.port
  server.stop(true)
  const started = performance.now()
  const err = await probeConnect(`http://127.0.0.1:${port}/v1`, 'down', 5000).catch((e) => e)
  expect(err).toBeInstanceOf(UpstreamFailed)
  expect(err.code).toBe('upstream_error')
  expect(performance.now() - started).toBeLessThan(1000)
})
