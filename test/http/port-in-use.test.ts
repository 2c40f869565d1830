import { expect, test } from 'bun:test'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from '../helpers/process.ts'

const MAIN = join(import.meta.dir, '../../src/main.ts')

/** `tropa --demo` on `port` with a fresh data dir, as a process. */
const demo = (port: number, output: 'ignore' | 'pipe') =>
  Bun.spawn(
    [
      process.execPath,
      MAIN,
      '--demo',
      '--port',
      String(port),
      '--data-dir',
      mkdtempSync(join(tmpdir(), 'tropa-port-')),
    ],
    {
      stdout: output,
      stderr: output,
      env: { PATH: process.env.PATH ?? '' },
    },
  )

// Elysia listens with SO_REUSEPORT unless told otherwise: a second Tropa on a port in use would
// then share it silently, each process answering some of the connections with its own keys.
test('a second Tropa on a port in use does not start (no silent sharing of the port)', async () => {
  const port = freePort()
  const first = demo(port, 'ignore')
  try {
    // Started from source beside the rest of the suite on a 2-core machine, a start can take
    // over 10 s (it once did in CI): wait up to 40 s, and stop waiting if it exits.
    let ready = false
    const until = Date.now() + 40_000
    while (!ready && first.exitCode === null && Date.now() < until) {
      ready = await fetch(`http://127.0.0.1:${port}/ready`).then(
        (r) => r.ok,
        () => false,
      )
      if (!ready) await Bun.sleep(20)
    }
    expect({ ready, exitCode: first.exitCode }).toEqual({ ready: true, exitCode: null })
    const second = demo(port, 'pipe')
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
}, 90_000)

// Several workers share the port with SO_REUSEPORT among themselves only: their primary first
// listens without it, so a port held by anyone else stops the start, and a plain Tropa started
// after them finds the port taken.
test('workers share the port only among themselves', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-port-w-'))
  const config = join(dir, 'tropa.json')
  await Bun.write(
    config,
    JSON.stringify({
      server: { data_dir: dir, log_level: 'error' },
      models: [
        {
          id: 'm/chat',
          kind: 'chat',
          context_length: 1024,
          pricing: { prompt: '0.00001', completion: '0.00001' },
          routes: [{ name: 'n', base_url: 'http://127.0.0.1:9/v1', upstream_model: 'x', max_concurrency: 1 }],
        },
      ],
    }),
  )
  const start = (port: number, workers: number, dataDir: string) =>
    Bun.spawn([process.execPath, MAIN, '--config', config, '--port', String(port), '--data-dir', dataDir], {
      stdout: 'pipe',
      stderr: 'pipe',
      env: { PATH: process.env.PATH ?? '', TROPA_WORKERS: String(workers) },
    })
  const refused = async (p: ReturnType<typeof start>) => {
    const code = await Promise.race([p.exited, Bun.sleep(20_000).then(() => 'still running' as const)])
    if (code === 'still running') p.kill('SIGKILL')
    expect(code).not.toBe('still running')
    expect(code).not.toBe(0)
    expect(await new Response(p.stderr).text()).toMatch(/in use|EADDRINUSE/i)
  }
  const waitReady = async (port: number) => {
    for (let i = 0; i < 1000; i++) {
      if (
        await fetch(`http://127.0.0.1:${port}/ready`).then(
          (r) => r.ok,
          () => false,
        )
      )
        return
      await Bun.sleep(10)
    }
    throw new Error('not ready')
  }
  // Two workers first: a Tropa of one process, and another of two, are refused.
  const port = freePort()
  const first = start(port, 2, join(dir, 'a'))
  try {
    await waitReady(port)
    await refused(start(port, 1, join(dir, 'b')))
    await refused(start(port, 2, join(dir, 'c')))
    expect((await fetch(`http://127.0.0.1:${port}/ready`)).ok).toBe(true)
  } finally {
    first.kill('SIGTERM')
    await first.exited
  }
  // One process first: a Tropa of two workers is refused.
  const port2 = freePort()
  const single = start(port2, 1, join(dir, 'd'))
  try {
    await waitReady(port2)
    await refused(start(port2, 2, join(dir, 'e')))
  } finally {
    single.kill('SIGKILL')
    await single.exited
  }
}, 90_000)
