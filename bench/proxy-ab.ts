#!/usr/bin/env bun
/**
 * `bun bench/proxy-ab.ts [--rounds 3] [--seconds 6] [--prompt-bytes N] VARIANT...`: event-loop CPU per request and
 * requests per second of proxies in front of the stub upstream of stub-router.ts (a 16-token
 * completion), 32 connections sending one request after another, the variants alternated round by
 * round (ABBA), each started afresh. It says what one feature of Tropa's request path costs when
 * added to a proxy that does nothing else, or what an environment variable does to the router.
 *
 * A VARIANT is either
 * - `bare[:FLAGS]`: the proxy below (the request and the answer parsed as JSON, the answer
 *   written again), FLAGS a comma-separated subset of `ctrl` (an AbortController per request,
 *   wired to the client's signal by a listener, as Tropa's dispatch does), `headers` (seven
 *   response headers, as Tropa sets), `text` (the upstream's text sent back as it is rather than
 *   stringified again);
 * - `tree:PATH[,NAME=VALUE...]`: a Tropa router from the source tree at PATH (`.` for this one),
 *   with the environment variables given (`tree:.,MIMALLOC_PURGE_DELAY=500`).
 *
 * Figures: bench/results/2026-11-26h-perf-probes.md.
 */
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import {
  benchChatBody,
  freePort,
  hammer,
  routerConfig,
  startRouter,
  startStub,
  threadTimes,
} from './stub-router.ts'

/** The bare proxy of a `bare:` variant (run as `proxy-ab.ts serve <upstream url> <port file> <flags>`). */
function serve(upstream: string, portFile: string, flags: Set<string>): void {
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    async fetch(req) {
      const body = JSON.parse(await req.text()) as Record<string, unknown>
      let signal = req.signal
      let onAbort: (() => void) | undefined
      if (flags.has('ctrl')) {
        const controller = new AbortController()
        onAbort = () => controller.abort()
        req.signal.addEventListener('abort', onAbort, { once: true })
        signal = controller.signal
      }
      const res = await fetch(upstream, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          authorization: req.headers.get('authorization') ?? '',
        },
        body: JSON.stringify(body),
        signal,
        decompress: true,
      })
      const text = await res.text()
      if (onAbort) req.signal.removeEventListener('abort', onAbort)
      const answer = JSON.parse(text) as Record<string, unknown>
      const headers: Record<string, string> = { 'content-type': 'application/json' }
      if (flags.has('headers')) {
        headers['x-request-id'] = `req_${Math.random().toString(36).slice(2)}`
        headers['x-ratelimit-limit-requests'] = '1000'
        headers['x-ratelimit-remaining-requests'] = '999'
        headers['x-ratelimit-reset-requests'] = '1s'
        headers['x-tropa-node'] = 'stub-0'
        headers['x-tropa-cost-rub'] = '0.000123'
        headers['openai-processing-ms'] = '3'
      }
      return new Response(flags.has('text') ? text : JSON.stringify({ ...answer, id: 'chatcmpl-bare' }), {
        status: res.status,
        headers,
      })
    },
  })
  writeFileSync(portFile, String(server.port))
}

interface Started {
  proc: ReturnType<typeof Bun.spawn>
  url: string
  headers: Record<string, string>
}

async function start(variant: string, dir: string, stubPort: number): Promise<Started> {
  const at = mkdtempSync(join(dir, 'v'))
  if (variant.startsWith('tree:')) {
    const [tree, ...vars] = variant.slice('tree:'.length).split(',')
    const env = Object.fromEntries(
      vars.map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
    )
    const r = await startRouter({
      tree: resolve(tree ?? '.'),
      env,
      config: routerConfig(freePort(), join(at, 'data'), stubPort),
      configPath: join(at, 'tropa.json'),
    })
    return {
      proc: r.proc,
      url: `${r.url}/v1/chat/completions`,
      headers: { 'content-type': 'application/json', authorization: `Bearer ${r.key}` },
    }
  }
  if (variant !== 'bare' && !variant.startsWith('bare:')) throw new Error(`unknown variant ${variant}`)
  const portFile = join(at, 'port')
  const proc = Bun.spawn(
    [
      process.execPath,
      import.meta.path,
      'serve',
      `http://127.0.0.1:${stubPort}/v1/chat/completions`,
      portFile,
      variant.slice('bare:'.length),
    ],
    { stdout: 'inherit', stderr: 'inherit' },
  )
  for (let i = 0; ; i++) {
    const f = Bun.file(portFile)
    if ((await f.exists()) && (await f.text()).length > 0)
      return {
        proc,
        url: `http://127.0.0.1:${await f.text()}/`,
        headers: { 'content-type': 'application/json', authorization: 'Bearer none' },
      }
    if (i > 500) throw new Error(`${variant} did not start`)
    await Bun.sleep(20)
  }
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { rounds: { type: 'string' }, seconds: { type: 'string' }, 'prompt-bytes': { type: 'string' } },
  })
  const BODY = benchChatBody(Number(values['prompt-bytes'] ?? 0))
  const rounds = Number(values.rounds ?? 3)
  const seconds = Number(values.seconds ?? 6)
  if (positionals.length === 0) throw new Error('usage: bun bench/proxy-ab.ts [--rounds N] VARIANT...')
  const dir = mkdtempSync(join(tmpdir(), 'proxy-ab-'))
  const stub = startStub(dir)
  const got = new Map<string, { us: number[]; all: number[]; rps: number[] }>(
    positionals.map((v) => [v, { us: [], all: [], rps: [] }]),
  )
  const sum = (m: Map<string, number>) => [...m.values()].reduce((p, q) => p + q, 0)
  try {
    for (let r = 0; r < rounds; r++) {
      for (const v of r % 2 ? [...positionals].reverse() : positionals) {
        const s = await start(v, dir, stub.port)
        try {
          await hammer(s.url, s.headers, BODY, 32, 2000)
          const a = threadTimes(s.proc.pid)
          const n = await hammer(s.url, s.headers, BODY, 32, seconds * 1000)
          const b = threadTimes(s.proc.pid)
          const x = got.get(v)!
          x.us.push((b.get('loop')! - a.get('loop')!) / n)
          x.all.push((sum(b) - sum(a)) / n)
          x.rps.push(n / seconds)
          console.log(
            `round ${r + 1} ${v}: ${x.us.at(-1)!.toFixed(1)} us a request (${x.all.at(-1)!.toFixed(1)} in all threads), ${x.rps.at(-1)!.toFixed(0)}/s`,
          )
        } finally {
          s.proc.kill()
          await s.proc.exited
        }
      }
    }
  } finally {
    stub.proc.kill()
  }
  const med = (xs: number[]) => [...xs].sort((p, q) => p - q)[Math.floor(xs.length / 2)]!
  const list = (xs: number[], d: number) =>
    `${med(xs).toFixed(d)} (${xs.map((u) => u.toFixed(d)).join(', ')})`
  console.log(
    `\n| variant | event-loop CPU per request, us (median; rounds) | all threads' CPU per request, us | requests/s (median; rounds) |`,
  )
  console.log('| --- | --- | --- | --- |')
  for (const [v, x] of got) console.log(`| ${v} | ${list(x.us, 1)} | ${list(x.all, 1)} | ${list(x.rps, 0)} |`)
}

if (process.argv[2] === 'serve')
  serve(
    process.argv[3]!,
    process.argv[4]!,
    new Set((process.argv[5] ?? '').split(',').filter((f) => f.length > 0)),
  )
else await main()
