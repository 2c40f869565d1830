#!/usr/bin/env bun
/**
 * Issue #24: what Tropa's heap holds per open stream. Tropa from source (bench/heap-hook.ts
 * preloaded), a fleet as stream-memory.ts runs it; a census (full collection, `bun:jsc` heapStats)
 * with no stream open and with N hold streams open, diffed per stream: resident, JS heap, objects
 * by type. `relay`: the bare proxy's relay variant instead.
 *
 * BUN_CONFIG_MAX_HTTP_REQUESTS=65535 bun bench/heap-census.ts [N=1000] [tropa|relay] [--snapshot] [--prompt-bytes N]
 *
 * Per stream it also prints the JS heap's capacity (the blocks its objects sit in) and mimalloc's
 * figures, before and after the collection: on 2026-11-28 the heap's capacity was most of the
 * resident set an open stream adds. `--snapshot`: a heap snapshot in V8's format with N streams
 * open, to read which closures and scopes each stream keeps (bench/results/2026-11-28k).
 */
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { join, resolve } from 'node:path'
import { chatBody } from './load.ts'
import { longestSeed, plan } from './phases.ts'
import { fdLimit, killAll } from './proc.ts'
import { benchChatBody } from './stub-router.ts'
import { type RunContext, startContestant, startFleet } from './targets.ts'

const n = Number(process.argv[2] ?? 1000)
const which = process.argv[3]?.startsWith('--') ? 'tropa' : (process.argv[3] ?? 'tropa')
const snapshot = process.argv.includes('--snapshot')
/** `--prompt-bytes N`: each stream's prompt N bytes of English words (a long prompt's share). */
const at = process.argv.indexOf('--prompt-bytes')
const promptBytes = at > 0 ? Number(process.argv[at + 1]) : 0
const repoRoot = resolve(import.meta.dir, '..')
const { plan: base } = plan(false, await fdLimit())
const dir = mkdtempSync(join(os.tmpdir(), 'tropa-census-'))
const logDir = join(dir, 'logs')
mkdirSync(logDir)
const wrapper = join(dir, 'tropa-src.sh')
writeFileSync(
  wrapper,
  `#!/bin/sh\nexec ${process.execPath} --max-http-header-size=65536 --preload ${repoRoot}/bench/heap-hook.ts ${repoRoot}/src/main.ts "$@"\n`,
)
chmodSync(wrapper, 0o755)
const fleet = await startFleet(repoRoot, dir, logDir, base.fleet)
const ctx: RunContext = { repoRoot, dir, logDir, fleet: fleet.urls, fleetPid: fleet.child.pid }
const seed = await longestSeed(fleet.urls.fast[0]!)
const c = which === 'relay' ? await relayPreloaded() : await startContestant('tropa', ctx, wrapper, '')
async function relayPreloaded() {
  const out = join(dir, 'relay.port')
  const child = Bun.spawn(
    [
      process.execPath,
      '--preload',
      `${repoRoot}/bench/heap-hook.ts`,
      `${repoRoot}/bench/bare-proxy.ts`,
      JSON.stringify(ctx.fleet),
      out,
      'relay',
    ],
    {
      env: { ...process.env, BUN_CONFIG_MAX_HTTP_REQUESTS: '65535' },
      stdio: ['ignore', 'inherit', 'inherit'],
    },
  )
  for (;;) {
    await Bun.sleep(50)
    try {
      const port = Number(readFileSync(out, 'utf8'))
      if (port) {
        return {
          pid: child.pid,
          endpoint: (f: string) => ({
            urls: [`http://127.0.0.1:${port}/${f}/v1/chat/completions`],
            headers: {},
          }),
          model: () => 'chat-small',
          stop: async () => {
            child.kill()
            await child.exited
          },
        }
      }
    } catch {}
  }
}
const census = async (k: number) => {
  process.kill(c.pid, 'SIGUSR2')
  for (;;) {
    await Bun.sleep(200)
    try {
      return JSON.parse(readFileSync(`/tmp/heap-${c.pid}-${k}.json`, 'utf8'))
    } catch {}
  }
}
try {
  const e = c.endpoint('hold')
  const body =
    promptBytes > 0
      ? benchChatBody(promptBytes, { model: c.model('hold'), stream: true, max_tokens: 64, seed })
      : chatBody(c.model('hold'), { stream: true, maxTokens: 64, seed })
  // warm up
  const fast = chatBody(c.model('fast'), { stream: false, maxTokens: 16, seed: 1 })
  for (let i = 0; i < 30; i++)
    await (
      await fetch(c.endpoint('fast').urls[0]!, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...e.headers },
        body: fast,
      })
    ).text()
  const a = await census(0)
  const abort = new AbortController()
  let opened = 0
  const all: Promise<void>[] = []
  for (let i = 0; i < n; i++) {
    all.push(
      (async () => {
        const res = await fetch(e.urls[0]!, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...e.headers },
          body,
          signal: abort.signal,
        })
        const r = res.body!.getReader()
        await r.read()
        opened++
        try {
          for (;;) if ((await r.read()).done) break
        } catch {}
      })().catch(() => {}),
    )
    if (i % 40 === 39) await Bun.sleep(20)
  }
  while (opened < n) await Bun.sleep(100)
  const b = await census(1)
  if (snapshot) {
    process.kill(c.pid, 'SIGUSR1')
    const file = `/tmp/heap-${c.pid}.heapsnapshot`
    for (let size = -1; ; ) {
      await Bun.sleep(1000)
      const now = Bun.file(file).size
      if (now > 0 && now === size) break
      size = now
    }
    console.log(`heap snapshot (V8 format): ${file}`)
  }
  abort.abort()
  console.log(
    `before GC: rss ${((b.preRssKiB - a.preRssKiB) / n).toFixed(1)} KiB/stream, heap ${((b.preHeap - a.preHeap) / n).toFixed(0)} B/stream`,
  )
  console.log(
    `rss ${(a.rssKiB / 1024).toFixed(1)} -> ${(b.rssKiB / 1024).toFixed(1)} MiB after GC: ${((b.rssKiB - a.rssKiB) / n).toFixed(1)} KiB/stream; heap ${((b.heapSize - a.heapSize) / n).toFixed(0)} B/stream, extra ${((b.extraMemorySize - a.extraMemorySize) / n).toFixed(0)} B/stream, objects ${((b.objectCount - a.objectCount) / n).toFixed(1)}/stream`,
  )
  const per = (x: number, y: number) => ((y - x) / n / 1024).toFixed(2)
  console.log(
    `pre-GC per stream KiB: rss ${per(a.preRssKiB * 1024, b.preRssKiB * 1024)} heapCapacity ${per(a.preCap, b.preCap)} mimalloc current ${per(a.preMem.current, b.preMem.current)} commit ${per(a.preMem.currentCommit, b.preMem.currentCommit)}`,
  )
  console.log(
    `post-GC per stream KiB: heapCapacity ${per(a.heapCapacity, b.heapCapacity)} mimalloc current ${per(a.mem.current, b.mem.current)} commit ${per(a.mem.currentCommit, b.mem.currentCommit)}`,
  )
  const diff = Object.keys(b.objectTypeCounts)
    .map((t) => [t, ((b.objectTypeCounts[t] ?? 0) - (a.objectTypeCounts[t] ?? 0)) / n] as const)
    .filter(([, d]) => Math.abs(d) >= 0.5)
    .sort((x, y) => y[1] - x[1])
  for (const [t, d] of diff) console.log(`  ${t}: ${d.toFixed(2)}`)
} finally {
  await c.stop()
  await fleet.child.stop()
  killAll()
  rmSync(dir, { recursive: true, force: true })
}
