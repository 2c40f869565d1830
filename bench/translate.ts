/**
 * `bun bench/translate.ts`: what a translating provider adds to a request and to each event of a
 * stream, against the OpenAI-compatible pass-through, in-process and with no network in between.
 *
 * One simulated node per protocol (src/simulator, timeScale 0) answers one chat request and one
 * streamed request first; its replies are recorded, a stream split into its events. Then the
 * global fetch replays those bytes from memory (a stream one event per read, as an upstream sends
 * them), so what is timed is Tropa alone: each provider adapter's `send` through
 * ProviderRegistry (the request parsed and rebuilt in the provider's form, its headers, the reply
 * wrapped and translated back into OpenAI's form) and the read of that reply to its end, exactly
 * as the pipeline reads it. The OpenAI adapter is the baseline: it parses nothing and hands the
 * upstream's body on as it is.
 *
 * - Request: each call timed alone (send + read of the whole body), providers interleaved call by
 *   call so that a slower moment of a shared machine falls on all of them; p50 and p99 in
 *   microseconds, and the added latency = provider's percentile - pass-through's.
 * - Stream: each read of the reply's body timed (one upstream event arrives per read, all already
 *   in memory); the gap per event = the time of a read, p50 and p99; the added gap = the
 *   provider's - the pass-through's. The first read (the opening) is left out.
 *
 * Target (issue #18): a translated request adds under 50 us at p50. `--requests N` (default
 * 20,000 per provider), `--streams N` (default 300 per provider, 64 tokens each), `--quick` (the
 * smoke: 300 requests, 10 streams), `--json FILE` (default .bench/results/translate-<time>.json).
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { type Config, loadConfig } from '../src/config/load.ts'
import type { ProviderKind } from '../src/config/schema.ts'
import { loadTokenizer } from '../src/pipeline/tokens.ts'
import { type SimNode, startSimNode } from '../src/simulator/index.ts'
import { ANTHROPIC_SIM_KEY } from '../src/simulator/protocols/anthropic.ts'
import { SIM_AZURE_API_KEY } from '../src/simulator/protocols/azure.ts'
import type { UpstreamCall } from '../src/upstream/adapter.ts'
import { streamOverFetch } from '../src/upstream/h1.ts'
import { ProviderRegistry } from '../src/upstream/providers/index.ts'
import { Watchdog } from '../src/upstream/watchdog.ts'

const repoRoot = resolve(import.meta.dir, '..')
const log = (m: string) => console.error(`[translate] ${m}`)

/** The pass-through first: every other kind is measured against it. */
export const KINDS = ['openai', 'azure', 'anthropic', 'gemini', 'gigachat', 'yandex'] as const
type Kind = (typeof KINDS)[number] & ProviderKind

/** Target of issue #18: the added p50 of a translated request, microseconds. */
export const TARGET_ADDED_P50_US = 50

const GIGACHAT_KEY = btoa('tropa-client:tropa-secret')
const GEMINI_KEY = 'AIzaSyDsim-0123456789abcdefghijklmnopq'
const YANDEX_KEY = 'AQVNtropabenchkey'

/** The routes' config for one node of each protocol. */
function routeOf(kind: Kind, n: SimNode): Record<string, unknown> {
  const origin = new URL(n.url).origin
  const base = { name: n.name, provider: kind, max_concurrency: 100_000 }
  switch (kind) {
    case 'openai':
      return { ...base, base_url: n.url, upstream_model: 'chat-small' }
    case 'azure':
      return {
        ...base,
        base_url: origin,
        upstream_model: 'gpt-dep',
        api_version: '2024-10-21',
        api_key_env: 'AZURE_KEY',
      }
    case 'anthropic':
      return {
        ...base,
        base_url: origin,
        upstream_model: 'claude-sim',
        headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
      }
    case 'gemini':
      return {
        ...base,
        base_url: origin,
        upstream_model: 'gemini-sim',
        headers: { 'x-goog-api-key': GEMINI_KEY },
      }
    case 'gigachat':
      return {
        ...base,
        base_url: `${origin}/api/v1`,
        auth_url: `${origin}/api/v2/oauth`,
        api_key_env: 'GIGACHAT_KEY',
        upstream_model: 'GigaChat',
      }
    case 'yandex':
      return {
        ...base,
        base_url: origin,
        api_key_env: 'YANDEX_KEY',
        folder_id: 'b1gbenchfolder',
        upstream_model: 'yandexgpt/latest',
      }
  }
}

/** One recorded upstream answer: its status, headers, and body as the events it came in. */
interface Recorded {
  status: number
  headers: [string, string][]
  events: Uint8Array[]
}

/** Splits a body into the events an upstream writes one at a time: SSE events, or JSON lines. */
export function splitEvents(bytes: Uint8Array): Uint8Array[] {
  const text = new TextDecoder().decode(bytes)
  const sep = /\r?\n\r?\n/.test(text) ? /(?<=\r?\n\r?\n)/ : /(?<=\n)/
  const enc = new TextEncoder()
  return text
    .split(sep)
    .filter((s) => s.length > 0)
    .map((s) => enc.encode(s))
}

const pct = (sorted: readonly number[], p: number) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * p) - 1)]!

export interface KindResult {
  kind: Kind
  request: { p50: number; p99: number; addedP50: number; addedP99: number; n: number }
  stream: { p50: number; p99: number; addedP50: number; addedP99: number; events: number }
}

export interface TranslateReport {
  date: string
  quick: boolean
  requestsPerKind: number
  streamsPerKind: number
  tokensPerStream: number
  targetAddedP50Us: number
  kinds: KindResult[]
  /** Every translating kind's added request p50 is under the target. */
  met: boolean
}

async function main() {
  const { values } = parseArgs({
    options: {
      requests: { type: 'string' },
      streams: { type: 'string' },
      quick: { type: 'boolean' },
      json: { type: 'string' },
    },
  })
  const quick = values.quick === true
  const requests = Number(values.requests ?? (quick ? 100 : 20_000))
  const streams = Number(values.streams ?? (quick ? 4 : 300))
  const tokens = 64

  // The simulator counts tokens with Tropa's tokenizer: loaded before its first answer is timed.
  await loadTokenizer()
  // One node of each protocol, answering at once.
  const nodes = await Promise.all(
    KINDS.map((kind, i) =>
      startSimNode({ name: `${kind}-1`, protocol: kind, timeScale: 0, seed: i + 1, ignoreEos: true }),
    ),
  )
  const dir = mkdtempSync(join(os.tmpdir(), 'tropa-translate-'))
  const configPath = join(dir, 'tropa.json')
  writeFileSync(
    configPath,
    JSON.stringify({
      server: { port: 0, data_dir: dir, log_level: 'error' },
      models: KINDS.map((kind, i) => ({
        id: `bench/${kind}`,
        kind: 'chat',
        context_length: 8192,
        pricing: { prompt: '0.000030', completion: '0.000060' },
        routes: [routeOf(kind, nodes[i]!)],
      })),
    }),
  )
  const config: Config = loadConfig(
    { configPath },
    { AZURE_KEY: SIM_AZURE_API_KEY, GIGACHAT_KEY, YANDEX_KEY },
  )
  const route = (kind: Kind) => config.models.find((m) => m.id === `bench/${kind}`)!.routes[0]!
  const registry = new ProviderRegistry(new Watchdog())
  // What the pipeline sends: its internal (OpenAI) body with the upstream's model and the bound.
  const callOf = (kind: Kind, stream: boolean): UpstreamCall => ({
    route: route(kind),
    path: '/chat/completions',
    stream,
    body: JSON.stringify({
      model: route(kind).upstreamModel,
      messages: [
        { role: 'system', content: 'You are brief.' },
        { role: 'user', content: 'Say something short about routers and queues.' },
      ],
      max_tokens: stream ? tokens : 16,
      temperature: 0.7,
      ...(stream && { stream: true, stream_options: { include_usage: true } }),
    }),
  })

  // Record: one real exchange per kind and mode, over HTTP with the simulator.
  const realFetch = globalThis.fetch
  const recorded = new Map<string, Recorded>()
  let recording = ''
  const recorder = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const res = await realFetch(input, init)
    const bytes = new Uint8Array(await res.arrayBuffer())
    const url = new URL(typeof input === 'string' ? input : input instanceof URL ? input.href : input.url)
    // GigaChat's token exchange is recorded too (under its own path), and replayed if asked again.
    const key = url.pathname.endsWith('/oauth') ? 'oauth' : recording
    const r: Recorded = { status: res.status, headers: [...res.headers], events: splitEvents(bytes) }
    recorded.set(key, r)
    return new Response(bytes, { status: res.status, headers: res.headers })
  }
  globalThis.fetch = recorder as typeof fetch
  // Streams too: the recorder and the replay stand in for fetch, so Tropa's own client
  // (upstream/h1.ts) is not used.
  streamOverFetch()
  for (const kind of KINDS)
    for (const stream of [false, true]) {
      recording = `${kind}:${stream}`
      const reply = await registry.send(callOf(kind, stream), new AbortController(), Date.now() + 60_000)
      const text = await reply.response.text()
      if (!text.includes(stream ? 'chat.completion.chunk' : '"chat.completion"'))
        throw new Error(`${kind}: the translated reply is not OpenAI's: ${text.slice(0, 300)}`)
    }
  await Promise.all(nodes.map((n) => n.stop()))

  // Replay: the recorded bytes from memory, a stream one event per read.
  let replaying = ''
  const replay = (input: string | URL | Request): Promise<Response> => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url
    const r = recorded.get(url.endsWith('/oauth') ? 'oauth' : replaying)!
    let i = 0
    const body: BodyInit =
      r.events.length === 1
        ? (r.events[0] as Uint8Array<ArrayBuffer>)
        : new ReadableStream<Uint8Array>({
            pull(c) {
              if (i < r.events.length) c.enqueue(r.events[i++]!)
              else c.close()
            },
          })
    return Promise.resolve(new Response(body, { status: r.status, headers: r.headers }))
  }
  globalThis.fetch = replay as typeof fetch

  const oneRequest = async (kind: Kind, call: UpstreamCall): Promise<number> => {
    replaying = `${kind}:false`
    const t0 = performance.now()
    const reply = await registry.send(call, new AbortController(), Date.now() + 10_000)
    await reply.response.text()
    return (performance.now() - t0) * 1000
  }
  const oneStream = async (kind: Kind, call: UpstreamCall, gaps: number[]): Promise<void> => {
    replaying = `${kind}:true`
    const reply = await registry.send(call, new AbortController(), Date.now() + 10_000)
    const reader = reply.response.body!.getReader()
    for (let first = true; ; first = false) {
      const t0 = performance.now()
      const { done } = await reader.read()
      const dt = (performance.now() - t0) * 1000
      if (done) return
      if (!first) gaps.push(dt)
    }
  }

  const calls = new Map(KINDS.map((k) => [k, { plain: callOf(k, false), stream: callOf(k, true) }]))
  const reqTimes = new Map<Kind, number[]>(KINDS.map((k) => [k, []]))
  const gaps = new Map<Kind, number[]>(KINDS.map((k) => [k, []]))
  // Warm-up (JIT), then the measured calls, interleaved kind by kind.
  log(`warming up; then ${requests} requests and ${streams} streams of ${tokens} tokens per provider`)
  for (let i = 0; i < Math.min(2000, requests); i++)
    for (const k of KINDS) await oneRequest(k, calls.get(k)!.plain)
  for (let i = 0; i < Math.min(20, streams); i++)
    for (const k of KINDS) await oneStream(k, calls.get(k)!.stream, [])
  for (let i = 0; i < requests; i++)
    for (const k of KINDS) reqTimes.get(k)!.push(await oneRequest(k, calls.get(k)!.plain))
  for (let i = 0; i < streams; i++)
    for (const k of KINDS) await oneStream(k, calls.get(k)!.stream, gaps.get(k)!)
  globalThis.fetch = realFetch

  const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b)
  const base = { req: sorted(reqTimes.get('openai')!), gap: sorted(gaps.get('openai')!) }
  const kinds: KindResult[] = KINDS.map((kind) => {
    const r = sorted(reqTimes.get(kind)!)
    const g = sorted(gaps.get(kind)!)
    return {
      kind,
      request: {
        p50: pct(r, 0.5),
        p99: pct(r, 0.99),
        addedP50: pct(r, 0.5) - pct(base.req, 0.5),
        addedP99: pct(r, 0.99) - pct(base.req, 0.99),
        n: r.length,
      },
      stream: {
        p50: pct(g, 0.5),
        p99: pct(g, 0.99),
        addedP50: pct(g, 0.5) - pct(base.gap, 0.5),
        addedP99: pct(g, 0.99) - pct(base.gap, 0.99),
        events: g.length,
      },
    }
  })
  const translated = kinds.filter((k) => k.kind !== 'openai')
  const report: TranslateReport = {
    date: new Date().toISOString(),
    quick,
    requestsPerKind: requests,
    streamsPerKind: streams,
    tokensPerStream: tokens,
    targetAddedP50Us: TARGET_ADDED_P50_US,
    kinds,
    met: translated.every((k) => k.request.addedP50 < TARGET_ADDED_P50_US),
  }

  const us = (x: number) => x.toFixed(1)
  console.log(`Translated request: adapter send + reply read, in-process, ${requests} per provider (us)\n`)
  console.log('| provider | p50 | p99 | added p50 | added p99 | target: added p50 < 50 us |')
  console.log('| --- | --- | --- | --- | --- | --- |')
  for (const k of kinds)
    console.log(
      `| ${k.kind === 'openai' ? 'openai (pass-through)' : k.kind} | ${us(k.request.p50)} | ${us(k.request.p99)} | ${k.kind === 'openai' ? '-' : us(k.request.addedP50)} | ${k.kind === 'openai' ? '-' : us(k.request.addedP99)} | ${k.kind === 'openai' ? '-' : k.request.addedP50 < TARGET_ADDED_P50_US ? 'met' : 'MISSED'} |`,
    )
  console.log(
    `\nTranslated stream: time per event read, ${streams} streams of ${tokens} tokens per provider (us)\n`,
  )
  console.log('| provider | gap p50 | gap p99 | added p50 | added p99 | events |')
  console.log('| --- | --- | --- | --- | --- | --- |')
  for (const k of kinds)
    console.log(
      `| ${k.kind === 'openai' ? 'openai (pass-through)' : k.kind} | ${us(k.stream.p50)} | ${us(k.stream.p99)} | ${k.kind === 'openai' ? '-' : us(k.stream.addedP50)} | ${k.kind === 'openai' ? '-' : us(k.stream.addedP99)} | ${k.stream.events} |`,
    )
  console.log(
    `\ntarget (added p50 of a translated request under ${TARGET_ADDED_P50_US} us): ${report.met ? 'met' : 'MISSED'} for ${translated.length} providers`,
  )
  const out =
    values.json ?? join(repoRoot, '.bench', 'results', `translate-${report.date.replace(/[:.]/g, '-')}.json`)
  mkdirSync(dirname(out), { recursive: true })
  writeFileSync(out, JSON.stringify(report, null, 2))
  log(`wrote ${out}`)
  process.exit(0)
}

if (import.meta.main) await main()
