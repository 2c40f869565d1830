import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI, { toFile } from 'openai'

// Builds the single executable once and runs it from an empty directory (no node_modules,
// no sources beside it): the demo must start, serve a chat and a stream, and restart on its data.
const root = join(import.meta.dir, '../..')
const exe = join(root, 'dist/tropa')
const work = mkdtempSync(join(tmpdir(), 'tropa-bin-'))

beforeAll(async () => {
  const build = Bun.spawnSync([process.execPath, 'run', 'build'], {
    cwd: root,
    stdout: 'pipe',
    stderr: 'pipe',
  })
  if (build.exitCode !== 0) throw new Error(`build failed: ${build.stderr.toString()}`)
  expect(existsSync(exe)).toBe(true)
}, 120_000)
afterAll(() => rmSync(work, { recursive: true, force: true }))

async function startDemo(dataDir: string, env: Record<string, string> = {}) {
  const proc = Bun.spawn([exe, '--demo', '--port', '0', '--data-dir', dataDir], {
    cwd: work,
    stdout: 'pipe',
    stderr: 'pipe',
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work, ...env },
  })
  const credsFile = join(dataDir, 'demo-credentials.json')
  const started = Date.now()
  let out = ''
  const reader = proc.stdout.getReader()
  while (!out.includes('Try it:')) {
    const { value, done } = await reader.read()
    if (done) throw new Error(`tropa exited early: ${await new Response(proc.stderr).text()}`)
    out += new TextDecoder().decode(value)
    if (Date.now() - started > 15_000) throw new Error(`no banner: ${out}`)
  }
  reader.releaseLock()
  const creds = JSON.parse(readFileSync(credsFile, 'utf8')) as {
    base_url: string
    api_key: string
    master_key: string
    admin_token: string
  }
  return { proc, out, creds, credsFile }
}

describe('the compiled executable', () => {
  test('exports traces over OTLP/HTTP (the SDK is inside it); the stop sends the last ones', async () => {
    const names: string[] = []
    const receiver = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      async fetch(req) {
        const body = (await req.json()) as {
          resourceSpans: { scopeSpans: { spans: { name: string }[] }[] }[]
        }
        for (const rs of body.resourceSpans)
          for (const ss of rs.scopeSpans) for (const sp of ss.spans) names.push(sp.name)
        return Response.json({})
      },
    })
    const demo = await startDemo(join(work, 'traced'), {
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${receiver.port}`,
    })
    try {
      const client = new OpenAI({
        baseURL: `${demo.creds.base_url}/v1`,
        apiKey: demo.creds.api_key,
        maxRetries: 0,
      })
      await client.chat.completions.create({
        model: 'sim/chat-small',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 3,
      })
    } finally {
      demo.proc.kill('SIGTERM')
      expect(await demo.proc.exited).toBe(0)
      receiver.stop(true)
    }
    expect(names).toContain('chat')
    expect(names).toContain('upstream attempt')
  }, 30_000)

  test('--help lists the subcommands and flags', () => {
    const r = Bun.spawnSync([exe, '--help'], { cwd: work })
    const text = r.stdout.toString()
    expect(r.exitCode).toBe(0)
    for (const word of ['serve', 'sim', '--demo', '--config', '--port', '--data-dir'])
      expect(text).toContain(word)
  })

  test('starts its workers (itself again, with the same arguments); SIGTERM stops them all', async () => {
    const dir = mkdtempSync(join(work, 'workers-'))
    const cfg = join(dir, 'tropa.json')
    writeFileSync(
      cfg,
      JSON.stringify({
        server: { data_dir: join(dir, 'data'), log_level: 'error', workers: 2 },
        models: [
          {
            id: 'm/chat',
            kind: 'chat',
            context_length: 1024,
            pricing: { prompt: '0.00001', completion: '0.00001' },
            routes: [
              { name: 'n', base_url: 'http://127.0.0.1:9/v1', upstream_model: 'x', max_concurrency: 1 },
            ],
          },
        ],
      }),
    )
    const s = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response() })
    const port = s.port!
    s.stop(true)
    const proc = Bun.spawn([exe, '--config', cfg, '--port', String(port)], {
      cwd: work,
      stdout: 'ignore',
      stderr: 'pipe',
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work },
    })
    const pids = new Map<number, number>()
    for (let i = 0; i < 1500 && pids.size < 2; i++) {
      const h = (await fetch(`http://127.0.0.1:${port}/health`, { keepalive: false }).then(
        (r) => r.json(),
        () => undefined,
      )) as { worker: number; pid: number } | undefined
      if (h) pids.set(h.worker, h.pid)
      else await Bun.sleep(10)
    }
    expect([...pids.keys()].sort()).toEqual([0, 1])
    // The primary started again in place with its runtime setting (src/cli/tuned-runtime.ts),
    // keeping its name; the workers inherit the setting and start once.
    if (process.platform === 'linux')
      for (const pid of [proc.pid, ...pids.values()]) {
        expect(readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')).toContain(
          'BUN_JSC_useWarmUpMarkedBlocks=0',
        )
        expect(readFileSync(`/proc/${pid}/comm`, 'utf8').trim()).toBe('tropa')
      }
    proc.kill('SIGTERM')
    expect(await proc.exited).toBe(0)
    for (const pid of pids.values()) expect(() => process.kill(pid, 0)).toThrow()
  }, 60_000)

  test('a bad config stops the start with a message naming the key and fix', () => {
    const cfg = join(work, 'bad.toml')
    writeFileSync(cfg, '[server]\nprot = 1\n')
    const r = Bun.spawnSync([exe, '--config', cfg], { cwd: work })
    expect(r.exitCode).toBe(2)
    expect(r.stderr.toString()).toContain('server.prot')
    expect(r.stderr.toString()).toContain('Fix:')
  })

  test('serves /docs and its viewer from inside the executable (no CDN, no node_modules)', async () => {
    // The viewer's files are embedded by the build: the binary holds them, names no
    // node_modules path, and serves the package's bytes from an empty directory.
    const binary = await Bun.file(exe).bytes()
    expect(Buffer.from(binary).includes('node_modules/swagger-ui-dist')).toBe(false)
    const pkg = join(root, 'node_modules/swagger-ui-dist')
    const demo = await startDemo(join(work, 'data-docs'))
    try {
      const base = demo.creds.base_url
      const page = await fetch(`${base}/docs`)
      expect(page.status).toBe(200)
      expect(page.headers.get('content-security-policy')).toContain("script-src 'self'")
      const html = await page.text()
      const refs = [...html.matchAll(/(?:src|href)="(\/docs\/assets\/[^"]+)"/g)].map((m) => m[1]!)
      expect(refs.length).toBe(3)
      const served = new Map<string, Uint8Array>()
      for (const ref of refs) {
        const r = await fetch(`${base}${ref}`)
        expect(r.status).toBe(200)
        served.set(ref.replace(/^\/docs\/assets\/([\w-]+)\..*$/, '$1'), await r.bytes())
      }
      const bundle = readFileSync(join(pkg, 'swagger-ui-bundle.js'))
      const css = readFileSync(join(pkg, 'swagger-ui.css'))
      expect(Buffer.from(served.get('swagger-ui-bundle')!).equals(bundle)).toBe(true)
      expect(Buffer.from(served.get('swagger-ui')!).equals(css)).toBe(true)
      expect(Buffer.from(binary).includes(bundle.subarray(0, 4096))).toBe(true)
      const doc = (await (await fetch(`${base}/docs/json`)).json()) as { paths: Record<string, unknown> }
      expect(Object.keys(doc.paths)).toContain('/v1/chat/completions')
    } finally {
      demo.proc.kill('SIGTERM')
      await demo.proc.exited
    }
  }, 30_000)

  test('serves the console from inside the executable: its embedded bundle, under 150 KB gzipped, and sign-in', async () => {
    const demo = await startDemo(join(work, 'data-console'))
    try {
      const base = demo.creds.base_url.replace(/\/v1$/, '')
      const home = await fetch(`${base}/`, { redirect: 'manual' })
      expect(home.headers.get('location')).toBe('/console')
      const page = await fetch(`${base}/console`)
      expect(page.status).toBe(200)
      expect(page.headers.get('content-security-policy')).toContain("script-src 'self'")
      const html = await page.text()
      const refs = [...html.matchAll(/(?:src|href)="(\/console\/assets\/[^"]+)"/g)].map((m) => m[1]!)
      expect(refs.length).toBe(2)
      let gzipped = 0
      for (const ref of refs) {
        const r = await fetch(`${base}${ref}`)
        expect(r.status).toBe(200)
        const body = await r.bytes()
        // The bytes `bun run build` wrote to dist/console/ (scripts/build-console.ts).
        const built = readFileSync(
          join(root, 'dist/console', ref.endsWith('.js') ? 'console.js' : 'console.css'),
        )
        expect(Buffer.from(body).equals(built)).toBe(true)
        gzipped += Bun.gzipSync(body).length
      }
      expect(gzipped).toBeLessThan(150 * 1024)
      const signIn = await fetch(`${base}/console/session`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ token: demo.creds.master_key }),
      })
      expect(signIn.status).toBe(201)
      const cookie = (signIn.headers.get('set-cookie') ?? '').split(';')[0]!
      const org = await fetch(`${base}/console/api/v1/organization`, { headers: { cookie } })
      expect(org.status).toBe(200)
    } finally {
      demo.proc.kill('SIGTERM')
      await demo.proc.exited
    }
  }, 30_000)

  test('demo: banner, one chat, one stream; a restart reuses the organization and keys', async () => {
    const dataDir = join(work, 'data')
    const first = await startDemo(dataDir)
    try {
      expect(first.out).toContain('Admin token (shown once')
      expect(first.out).toContain(first.creds.api_key)
      expect(statSync(first.credsFile).mode & 0o777).toBe(0o600)
      expect(statSync(join(dataDir, 'admin-token')).mode & 0o777).toBe(0o600)
      const client = new OpenAI({
        baseURL: `${first.creds.base_url}/v1`,
        apiKey: first.creds.api_key,
        maxRetries: 0,
      })
      const r = await client.chat.completions.create({
        model: 'sim/chat-small',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 5,
      })
      expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
      const stream = await client.chat.completions.create({
        model: 'sim/chat-small',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 5,
        stream: true,
        stream_options: { include_usage: true },
      })
      let usage: OpenAI.CompletionUsage | null | undefined
      for await (const c of stream) usage = c.usage ?? usage
      expect(usage?.completion_tokens).toBe(5)
      const e = await client.embeddings.create({ model: 'sim/embed-small', input: 'x' })
      expect(e.data[0]!.embedding.length).toBe(256)
      // Batches run in a worker thread: this proves the worker is bundled into the executable.
      const line = (i: number) =>
        JSON.stringify({
          custom_id: `c${i}`,
          method: 'POST',
          url: '/v1/chat/completions',
          body: { model: 'sim/chat-small', messages: [{ role: 'user', content: `q${i}` }], max_tokens: 3 },
        })
      const file = await client.files.create({
        file: await toFile(Buffer.from(`${line(1)}\n${line(2)}\n`), 'b.jsonl'),
        purpose: 'batch',
      })
      let batch = await client.batches.create({
        input_file_id: file.id,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
      })
      for (let i = 0; i < 200 && !['completed', 'failed'].includes(batch.status); i++) {
        await Bun.sleep(50)
        batch = await client.batches.retrieve(batch.id)
      }
      expect(batch.status).toBe('completed')
      expect(batch.request_counts?.completed).toBe(2)
      const watch = Bun.spawnSync(
        [
          exe,
          'batches',
          'watch',
          batch.id,
          '--base-url',
          first.creds.base_url,
          '--api-key',
          first.creds.api_key,
        ],
        { cwd: work },
      )
      expect(watch.exitCode).toBe(0)
      expect(watch.stdout.toString()).toContain('100% 2/2 done, 0 failed')
      expect(watch.stdout.toString()).toContain('completed')
    } finally {
      first.proc.kill('SIGTERM')
      await first.proc.exited
    }
    const second = await startDemo(dataDir)
    try {
      expect(second.out).not.toContain('Admin token (shown once')
      expect(second.creds.api_key).toBe(first.creds.api_key)
      const client = new OpenAI({
        baseURL: `${second.creds.base_url}/v1`,
        apiKey: second.creds.api_key,
        maxRetries: 0,
      })
      const providerModels = [
        'anthropic/claude-sim',
        'google/gemini-sim',
        'azure/gpt-4o-sim',
        'gigachat/gigachat-sim',
        'yandex/yandexgpt-sim',
      ]
      expect((await client.models.list()).data.map((m) => m.id)).toEqual([
        'sim/chat-small',
        'sim/embed-small',
        ...providerModels,
      ])
      // The runtime's header limit baked into the executable (--compile-exec-argv) sits above
      // Tropa's: 20 KiB of headers get Tropa's 431 with an error body.
      const big = await fetch(`${second.creds.base_url}/v1/models`, {
        headers: { 'x-big': 'a'.repeat(20_000) },
      })
      expect(big.status).toBe(431)
      expect(((await big.json()) as { error: { code: string } }).error.code).toBe(
        'request_header_fields_too_large',
      )
      // Each provider's adapter and simulated front are in the executable: one answer through each.
      for (const model of providerModels) {
        const done = await client.chat.completions.create({
          model,
          messages: [{ role: 'user', content: 'hi' }],
          max_tokens: 3,
        })
        expect(done.model).toBe(model)
        expect(done.usage?.completion_tokens).toBeGreaterThan(0)
      }
    } finally {
      second.proc.kill('SIGTERM')
      await second.proc.exited
    }
    const check = Bun.spawnSync([exe, 'store', 'check', '--data-dir', dataDir], { cwd: work })
    expect(check.exitCode).toBe(0)
    expect(check.stdout.toString()).toContain(`ok: ${join(dataDir, 'tropa.db')} is sound`)
  }, 60_000)
})
