import { afterEach, describe, expect, test } from 'bun:test'
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { basename, join } from 'node:path'
import { startsRouter, WARM_UP_ENV } from '../../src/cli/tuned-runtime.ts'
import { freePort } from '../helpers/process.ts'

// The router starts again in place with JavaScriptCore's block warm-up thread off
// (src/cli/tuned-runtime.ts): the same process id serves, its environment carries the setting,
// and the thread is gone; a setting given by the operator is kept as it is.

const MAIN = join(import.meta.dir, '../../src/main.ts')
const dirs: string[] = []
const procs: ReturnType<typeof Bun.spawn>[] = []

afterEach(async () => {
  for (const p of procs.splice(0)) {
    p.kill('SIGKILL')
    await p.exited
  }
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true })
})

/** The demo router from the sources, its environment as given; resolves when it answers. */
async function demo(env: Record<string, string>) {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-tuned-'))
  dirs.push(dir)
  const port = freePort()
  const proc = Bun.spawn(
    [
      process.execPath,
      '--max-http-header-size=65536',
      MAIN,
      '--demo',
      '--port',
      String(port),
      '--data-dir',
      dir,
    ],
    { stdout: 'ignore', stderr: 'pipe', env: { PATH: process.env.PATH ?? '', TROPA_WORKERS: '1', ...env } },
  )
  procs.push(proc)
  const url = `http://127.0.0.1:${port}`
  for (let i = 0; i < 1000; i++) {
    try {
      if ((await fetch(`${url}/ready`)).ok) break
    } catch {}
    if (i === 999) throw new Error(`router did not start: ${await new Response(proc.stderr).text()}`)
    await Bun.sleep(10)
  }
  // The demo writes its credentials just after it starts listening.
  let key = ''
  for (let i = 0; i < 500 && key === ''; i++) {
    try {
      key = (JSON.parse(readFileSync(join(dir, 'demo-credentials.json'), 'utf8')) as { api_key: string })
        .api_key
    } catch {
      await Bun.sleep(10)
    }
  }
  return { proc, url, key }
}

/** Some load, so that the heap grows and the warm-up thread (when on) is started. */
async function load(url: string, key: string) {
  for (let round = 0; round < 10; round++)
    await Promise.all(
      Array.from({ length: 20 }, async () => {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'sim/chat-small',
            messages: [{ role: 'user', content: 'x'.repeat(2000) }],
            max_tokens: 4,
          }),
        })
        expect(res.status).toBe(200)
        await res.arrayBuffer()
      }),
    )
}

const threads = (pid: number) =>
  readdirSync(`/proc/${pid}/task`).map((t) => readFileSync(`/proc/${pid}/task/${t}/comm`, 'utf8').trim())

const environ = (pid: number) => readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')

describe('startsRouter', () => {
  test('serve, flags or nothing start the router; the other subcommands and help do not', () => {
    for (const args of [
      [],
      ['serve'],
      ['serve', '--demo'],
      ['--demo'],
      ['--config', 'x.toml'],
      ['--port', '0'],
    ])
      expect(startsRouter(args)).toBe(true)
    for (const args of [
      ['--help'],
      ['-h'],
      ['--version'],
      ['version'],
      ['help'],
      ['sim'],
      ['batches', 'watch'],
    ])
      expect(startsRouter(args)).toBe(false)
  })
})

describe.skipIf(process.platform !== 'linux')('the runtime setting', () => {
  test('started without it, the router runs again in place with the warm-up thread off', async () => {
    const { proc, url, key } = await demo({})
    // The process spawned is the one serving: execve kept its id.
    expect(environ(proc.pid)).toContain(`${WARM_UP_ENV}=0`)
    // The same arguments, byte for byte, and the same name in ps, top and pkill.
    const cmdline = readFileSync(`/proc/${proc.pid}/cmdline`, 'utf8').split('\0')
    expect(cmdline.slice(1, 4)).toEqual(['--max-http-header-size=65536', MAIN, '--demo'])
    expect(readFileSync(`/proc/${proc.pid}/comm`, 'utf8').trim()).toBe(
      basename(process.execPath).slice(0, 15),
    )
    await load(url, key)
    expect(threads(proc.pid)).not.toContain('JSCWarmUp')
  }, 30_000)

  test("an operator's setting is kept: with it on, the thread runs", async () => {
    const { proc, url, key } = await demo({ [WARM_UP_ENV]: '1' })
    expect(environ(proc.pid)).toContain(`${WARM_UP_ENV}=1`)
    expect(environ(proc.pid)).not.toContain(`${WARM_UP_ENV}=0`)
    await load(url, key)
    // The control: the same load with Bun's default starts the thread this setting stops.
    expect(threads(proc.pid)).toContain('JSCWarmUp')
  }, 30_000)
})
