import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startSimFleet } from '../../src/simulator/index.ts'
import { freePort, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN, defaultModels } from '../helpers/start.ts'

// Huge request headers: Tropa refuses them itself (server.max_header_bytes, 16 KiB by default)
// with a 431 and OpenAI's error body, below the runtime's own limit (raised to 64 KiB where Tropa
// is started), whose refusal has no body. Past 64 KiB the runtime's bare 431 remains.
const dir = mkdtempSync(join(tmpdir(), 'tropa-headers-'))
let fleet: Awaited<ReturnType<typeof startSimFleet>>
let router: Awaited<ReturnType<typeof startRouterProcess>>
beforeAll(async () => {
  fleet = await startSimFleet([{ name: 'sim-1', seed: 1, timeScale: 0 }])
  writeFileSync(
    join(dir, 'tropa.json'),
    JSON.stringify({
      server: { data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'error' },
      models: defaultModels(fleet.nodes),
    }),
  )
  router = await startRouterProcess(join(dir, 'tropa.json'), freePort())
})
afterAll(async () => {
  router?.proc.kill()
  await router?.proc.exited
  await fleet?.stop()
  rmSync(dir, { recursive: true, force: true })
})

/** A raw HTTP/1.1 GET with one header of `bytes` bytes; the status line and body that come back. */
function rawGet(bytes: number): Promise<{ status: number; body: string }> {
  const port = Number(new URL(router.url).port)
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1')
    let data = ''
    s.on('data', (d) => {
      data += d.toString()
    })
    s.on('error', reject)
    s.on('close', () => {
      const [head = '', body = ''] = data.split('\r\n\r\n')
      resolve({ status: Number(head.split(' ')[1]), body })
    })
    s.write(`GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: ${'a'.repeat(bytes)}\r\n\r\n`)
  })
}

test('20 KiB and 60 KiB of headers: 431 with the OpenAI error body, from Tropa', async () => {
  for (const bytes of [20_000, 60_000]) {
    const res = await rawGet(bytes)
    expect(res.status).toBe(431)
    expect(JSON.parse(res.body)).toEqual({
      error: {
        message: 'request headers are larger than 16384 bytes',
        type: 'invalid_request_error',
        param: null,
        code: 'request_header_fields_too_large',
      },
    })
  }
})

test("past the runtime's 64 KiB: its own 431, and the router stays up", async () => {
  const res = await rawGet(100_000)
  expect(res.status).toBe(431)
  expect((await fetch(`${router.url}/health`)).status).toBe(200)
})

test('ordinary headers pass', async () => {
  const res = await fetch(`${router.url}/v1/models`, {
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'x-some': 'a'.repeat(8000) },
  })
  expect(res.status).toBe(200)
})
