import { expect, test } from 'bun:test'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from '../helpers/process.ts'

const MAIN = join(import.meta.dir, '../../src/main.ts')

// Elysia listens with SO_REUSEPORT unless told otherwise: a second Tropa on a port in use would
// then share it silently, each process answering some of the connections with its own keys.
test('a second Tropa on a port in use does not start (no silent sharing of the port)', async () => {
  const port = freePort()
  const first = Bun.spawn(
    [
      process.execPath,
      MAIN,
      '--demo',
      '--port',
      String(port),
      '--data-dir',
      mkdtempSync(join(tmpdir(), 'tropa-port-a-')),
    ],
    { stdout: 'ignore', stderr: 'ignore', env: { PATH: process.env.PATH ?? '' } },
  )
  try {
    let ready = false
    for (let i = 0; i < 1000 && !ready; i++) {
      ready = await fetch(`http://127.0.0.1:${port}/ready`).then(
        (r) => r.ok,
        () => false,
      )
      if (!ready) await Bun.sleep(10)
    }
    expect(ready).toBe(true)
    const second = Bun.spawn(
      [
        process.execPath,
        MAIN,
        '--demo',
        '--port',
        String(port),
        '--data-dir',
        mkdtempSync(join(tmpdir(), 'tropa-port-b-')),
      ],
      { stdout: 'pipe', stderr: 'pipe', env: { PATH: process.env.PATH ?? '' } },
    )
    const code = await Promise.race([second.exited, Bun.sleep(20_000).then(() => 'still running' as const)])
    if (code === 'still running') second.kill('SIGKILL')
    expect(code).not.toBe('still running')
    expect(code).not.toBe(0)
    expect(await new Response(second.stderr).text()).toMatch(/in use|EADDRINUSE/i)
    // The first one answers as before.
    expect((await fetch(`http://127.0.0.1:${port}/ready`)).ok).toBe(true)
  } finally {
    first.kill('SIGKILL')
    await first.exited
  }
}, 60_000)
