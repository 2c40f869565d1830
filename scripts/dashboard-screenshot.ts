// docs/observability/dashboard.png: the Grafana dashboard (docs/observability/grafana-dashboard.json)
// over real data, without Grafana (not installable here).
//
//   bun scripts/dashboard-screenshot.ts [--minutes 3] [--out docs/observability/dashboard.png]
//                                       [--step 2] [--rate-interval 15s] [--html page.html]
//
// 1. The demo's simulated fleet runs in this process (so its faults can be switched on for a
//    while) and Tropa runs from the sources as a child process with the demo's models
//    (src/demo.ts: demoModelFiles) in a temporary data dir.
// 2. Prometheus (Debian's /usr/bin/prometheus) runs as a child process on a free port with a
//    temporary config and storage, scraping Tropa's /metrics every second.
// 3. Traffic through the official SDKs for --minutes: chat (JSON and streamed) on every model of
//    the demo, Messages, Responses, embeddings, legacy completions, unknown models (404), a key
//    with a tiny limit (402), a key limited to 10 requests a minute (429), clients leaving mid-stream, two
//    batches; the rate rises and falls, and for a while one sim/ node and the Gemini node fail.
// 4. Every target of every panel is evaluated with /api/v1/query_range over the traffic window,
//    the dashboard's variables replaced as Grafana would with "All" selected; a query error
//    fails the script.
// 5. A page laid out by the panels' gridPos (uPlot for time series, inlined from node_modules)
//    is screenshot by headless Chromium (playwright-core).
// Every child process and temporary directory goes away at the end, failed or not.

import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import Anthropic from '@anthropic-ai/sdk'
import OpenAI, { toFile } from 'openai'
import { DEMO_ENV, demoModelFiles, startDemoFleet } from '../src/demo.ts'
import { launchChromium } from '../test/helpers/browser.ts'

const ROOT = join(import.meta.dir, '..')
const DASHBOARD = join(ROOT, 'docs/observability/grafana-dashboard.json')
const PROMETHEUS = '/usr/bin/prometheus'

// ---------------------------------------------------------------------------------------------
// The dashboard model, and what Grafana does with it (pure; test/unit/dashboard-screenshot.test.ts)

export interface GridPos {
  x: number
  y: number
  w: number
  h: number
}

export interface Target {
  expr?: string
  legendFormat?: string
  refId?: string
}

export interface Panel {
  type: string
  title: string
  gridPos: GridPos
  description?: string
  targets?: Target[]
  fieldConfig?: {
    defaults?: { unit?: string; custom?: { stacking?: { mode?: string }; fillOpacity?: number } }
  }
  options?: { legend?: { placement?: string; displayMode?: string }; graphMode?: string }
}

export interface TemplateVar {
  name: string
  type: string
  includeAll?: boolean
  allValue?: string
}

export interface Dashboard {
  title: string
  templating?: { list: TemplateVar[] }
  panels: Panel[]
}

/**
 * The values Grafana gives the dashboard's variables with "All" selected in every drop-down:
 * a query or custom variable becomes its `allValue` (Grafana would otherwise build a regex of
 * every value it found, `(a|b|c)`; this dashboard sets `.*`), and the built-ins
 * `$__interval` (the query's step), `$__rate_interval` and `$__range` get the given durations.
 * The datasource variable names the data source, not a value in a query: it is left out.
 */
export function dashboardVars(
  d: Dashboard,
  builtins: { interval: string; rateInterval: string; range: string },
): Record<string, string> {
  const vars: Record<string, string> = {
    __interval: builtins.interval,
    __rate_interval: builtins.rateInterval,
    __range: builtins.range,
  }
  for (const v of d.templating?.list ?? []) {
    if (v.type === 'datasource') continue
    if (!v.includeAll) throw new Error(`variable $${v.name} has no "All" option to render the dashboard with`)
    vars[v.name] = v.allValue ?? '.*'
  }
  return vars
}

/**
 * Replaces `$name`, `${name}`, `${name:format}` and `[[name]]` as Grafana does; a variable the
 * dashboard does not define is an error (Grafana would send it to Prometheus as it is, and the
 * query would fail there).
 */
export function substitute(expr: string, vars: Record<string, string>): string {
  return expr.replace(
    /\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)/g,
    (whole, braced?: string, bracketed?: string, bare?: string) => {
      const name = braced ?? bracketed ?? bare ?? ''
      const value = vars[name]
      if (value === undefined) throw new Error(`unknown variable ${whole} in ${expr}`)
      return value
    },
  )
}

/**
 * A series' name in the legend: the target's legendFormat with `{{label}}` replaced by the
 * series' labels (a missing label is empty), or else the labels as Prometheus writes them.
 */
export function legendName(format: string | undefined, metric: Record<string, string>): string {
  if (format) return format.replace(/\{\{\s*(\w+)\s*\}\}/g, (_, l: string) => metric[l] ?? '').trim()
  const { __name__: name = '', ...labels } = metric
  const inner = Object.entries(labels)
    .map(([k, v]) => `${k}="${v}"`)
    .join(', ')
  return inner ? `${name}{${inner}}` : name || 'value'
}

/**
 * A value as Grafana writes it for the units this dashboard uses. Self-contained (no outer
 * names): its source is also inlined into the page for the axes' labels.
 */
export function formatValue(unit: string | undefined, v: number | null | undefined): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return '–'
  const num = (x: number): string => {
    const a = Math.abs(x)
    if (a === 0) return '0'
    const decimals = a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : Math.min(6, 2 - Math.floor(Math.log10(a)))
    return String(Number(x.toFixed(decimals)))
  }
  switch (unit) {
    case 'reqps':
      return `${num(v)} req/s`
    case 'percentunit':
      return `${num(v * 100)}%`
    case 's': {
      const a = Math.abs(v)
      if (a === 0) return '0 s'
      if (a < 1e-3) return `${num(v * 1e6)} µs`
      if (a < 1) return `${num(v * 1e3)} ms`
      if (a < 60) return `${num(v)} s`
      return `${num(v / 60)} min`
    }
    case 'short': {
      const a = Math.abs(v)
      if (a >= 1e9) return `${num(v / 1e9)} Bil`
      if (a >= 1e6) return `${num(v / 1e6)} Mil`
      if (a >= 1e3) return `${num(v / 1e3)} K`
      return num(v)
    }
    default:
      return num(v)
  }
}

/** Prometheus's matrix on a regular grid: one slot per step, null where there is no finite value. */
export function onGrid(values: readonly [number, string][], start: number, step: number, n: number) {
  const out: (number | null)[] = new Array(n).fill(null)
  for (const [t, s] of values) {
    const i = Math.round((t - start) / step)
    const v = Number(s)
    if (i >= 0 && i < n && Number.isFinite(v)) out[i] = v
  }
  return out
}

/** The last value that is not null (Grafana's `lastNotNull`). */
export function lastNotNull(values: readonly (number | null)[]): number | null {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i]!
  return null
}

// ---------------------------------------------------------------------------------------------
// Processes and cleanup

const cleanups: (() => unknown)[] = []
async function cleanUp() {
  while (cleanups.length > 0) {
    try {
      await cleanups.pop()!()
    } catch (err) {
      console.error(`cleanup: ${(err as Error).message}`)
    }
  }
}

function freePort(): number {
  const s = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response() })
  const port = s.port!
  s.stop(true)
  return port
}

function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

/** A child process whose stdout and stderr go to a file; it is killed (TERM, then KILL) at cleanup. */
function spawnChild(name: string, cmd: string[], logFile: string, env: Record<string, string>) {
  const proc = Bun.spawn(cmd, {
    cwd: ROOT,
    // One Tropa process (server.workers defaults to the cores): the dashboard's series as one.
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: process.env.HOME ?? '/tmp',
      TROPA_WORKERS: '1',
      ...env,
    },
    stdin: 'ignore',
    stdout: Bun.file(logFile),
    stderr: Bun.file(logFile),
  })
  const tail = () => {
    try {
      return readFileSync(logFile, 'utf8').split('\n').slice(-20).join('\n')
    } catch {
      return ''
    }
  }
  cleanups.push(async () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return
    proc.kill('SIGTERM')
    const done = await Promise.race([proc.exited.then(() => true), Bun.sleep(10_000).then(() => false)])
    if (!done) {
      console.error(`${name} did not stop on SIGTERM: killing it`)
      proc.kill('SIGKILL')
      await proc.exited
    }
  })
  return { proc, tail }
}

async function waitFor(what: string, ok: () => Promise<boolean>, tail: () => string, ms = 30_000) {
  const until = Date.now() + ms
  while (Date.now() < until) {
    try {
      if (await ok()) return
    } catch {}
    await Bun.sleep(100)
  }
  throw new Error(`${what} did not come up within ${ms / 1000} s; its log ends:\n${tail()}`)
}

// ---------------------------------------------------------------------------------------------
// Traffic

const WORDS =
  'the a route model token node price limit stream answer prompt cache batch rouble latency queue fleet request server client budget window'.split(
    ' ',
  )
/** A long shared system prompt, so the simulated nodes' prefix caches report cached tokens. */
const SYSTEM = `You are a careful assistant for a routing service. ${Array.from(
  { length: 60 },
  (_, i) => `Rule ${i + 1}: answer about ${WORDS[i % WORDS.length]} and ${WORDS[(i * 7) % WORDS.length]}.`,
).join(' ')}`

let seed = 42
function rand(): number {
  // mulberry32: the same run of traffic each time (the fleet's own timings still vary)
  seed = (seed + 0x6d2b79f5) | 0
  let t = seed
  t = Math.imul(t ^ (t >>> 15), t | 1)
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}
const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!
const between = (lo: number, hi: number) => Math.floor(lo + rand() * (hi - lo + 1))
const sentence = (n: number) => Array.from({ length: n }, () => pick(WORDS)).join(' ')
function poisson(mean: number): number {
  let k = 0
  let p = Math.exp(-mean)
  let s = p
  const u = rand()
  while (u > s && k < 1000) {
    k++
    p *= mean / k
    s += p
  }
  return k
}

const CHAT_MODELS = [
  'sim/chat-small',
  'sim/chat-small',
  'sim/chat-small',
  'anthropic/claude-sim',
  'google/gemini-sim',
  'azure/gpt-4o-sim',
  'gigachat/gigachat-sim',
  'yandex/yandexgpt-sim',
]

interface Clients {
  openai: OpenAI
  anthropic: Anthropic
  limited: OpenAI
  throttled: OpenAI
}

type Kind =
  | 'chat'
  | 'chat-stream'
  | 'messages'
  | 'messages-stream'
  | 'responses'
  | 'embeddings'
  | 'completions'
  | 'unknown-model'
  | 'limited-key'
  | 'throttled-key'
  | 'abort-stream'

const KINDS: [Kind, number][] = [
  ['chat', 20],
  ['chat-stream', 30],
  ['messages', 4],
  ['messages-stream', 5],
  ['responses', 4],
  ['embeddings', 12],
  ['completions', 6],
  ['unknown-model', 3],
  ['limited-key', 3],
  ['throttled-key', 6],
  ['abort-stream', 3],
]
const KIND_TOTAL = KINDS.reduce((s, [, w]) => s + w, 0)
function pickKind(): Kind {
  let r = rand() * KIND_TOTAL
  for (const [k, w] of KINDS) {
    r -= w
    if (r < 0) return k
  }
  return 'chat'
}

const messages = (): OpenAI.Chat.ChatCompletionMessageParam[] => [
  ...(rand() < 0.5 ? [{ role: 'system' as const, content: SYSTEM }] : []),
  { role: 'user', content: sentence(between(5, 60)) },
]

async function one(kind: Kind, c: Clients): Promise<void> {
  const max_tokens = between(16, 160)
  switch (kind) {
    case 'chat':
      await c.openai.chat.completions.create({ model: pick(CHAT_MODELS), messages: messages(), max_tokens })
      return
    case 'chat-stream': {
      const stream = await c.openai.chat.completions.create({
        model: pick(CHAT_MODELS),
        messages: messages(),
        max_tokens,
        stream: true,
        stream_options: { include_usage: true },
      })
      for await (const _ of stream) {
      }
      return
    }
    case 'messages':
      await c.anthropic.messages.create({
        model: pick(['anthropic/claude-sim', 'sim/chat-small']),
        max_tokens,
        messages: [{ role: 'user', content: sentence(between(5, 40)) }],
      })
      return
    case 'messages-stream': {
      const stream = c.anthropic.messages.stream({
        model: pick(['anthropic/claude-sim', 'sim/chat-small']),
        max_tokens,
        system: SYSTEM,
        messages: [{ role: 'user', content: sentence(between(5, 40)) }],
      })
      await stream.finalMessage()
      return
    }
    case 'responses':
      await c.openai.responses.create({
        model: pick(['sim/chat-small', 'google/gemini-sim']),
        input: sentence(between(5, 40)),
        max_output_tokens: max_tokens,
        store: false,
      })
      return
    case 'embeddings':
      await c.openai.embeddings.create({
        model: 'sim/embed-small',
        input: Array.from({ length: between(1, 8) }, () => sentence(between(5, 80))),
      })
      return
    case 'completions':
      await c.openai.completions.create({
        model: 'sim/chat-small',
        prompt: sentence(between(5, 60)),
        max_tokens,
      })
      return
    case 'unknown-model':
      await c.openai.chat.completions.create({
        model: pick(['sim/chat-large', 'openai/gpt-9']),
        messages: messages(),
      })
      return
    case 'limited-key':
      await c.limited.chat.completions.create({
        model: 'anthropic/claude-sim',
        messages: messages(),
        max_tokens,
      })
      return
    case 'throttled-key':
      await c.throttled.embeddings.create({ model: 'sim/embed-small', input: sentence(20) })
      return
    case 'abort-stream': {
      const ac = new AbortController()
      const stream = await c.openai.chat.completions.create(
        { model: pick(CHAT_MODELS), messages: messages(), max_tokens: 200, stream: true },
        { signal: ac.signal },
      )
      const leaveAfter = between(2, 20)
      let chunks = 0
      for await (const _ of stream) if (++chunks === leaveAfter) ac.abort()
      if (ac.signal.aborted) throw new OpenAI.APIUserAbortError()
      return
    }
  }
}

/** Requests per second at `f` (0..1) of the window: two waves and a burst, never flat. */
export function rateAt(f: number, peak: number): number {
  const wave = 0.5 - 0.5 * Math.cos(2 * Math.PI * f * 1.5)
  const burst = f > 0.7 && f < 0.78 ? 0.6 : 0
  return peak * (0.15 + 0.65 * wave + burst)
}

interface Outcomes {
  [kind: string]: Record<string, number>
}

async function drive(c: Clients, ms: number, peak: number, onPhase: (f: number) => void): Promise<Outcomes> {
  const outcomes: Outcomes = {}
  const inFlight = new Set<Promise<void>>()
  const t0 = Date.now()
  const tickMs = 200
  let lastReport = 0
  for (let now = Date.now(); now - t0 < ms; now = Date.now()) {
    const f = (now - t0) / ms
    onPhase(f)
    const n = inFlight.size > 150 ? 0 : poisson((rateAt(f, peak) * tickMs) / 1000)
    for (let i = 0; i < n; i++) {
      const kind = pickKind()
      const p: Promise<void> = one(kind, c)
        .then(
          () => 'ok',
          (err: unknown) => {
            if (err instanceof OpenAI.APIUserAbortError || (err as Error)?.name === 'AbortError')
              return 'aborted'
            if (err instanceof OpenAI.APIError || err instanceof Anthropic.APIError)
              return String(err.status ?? 'stream error')
            return `other: ${(err as Error)?.message ?? err}`
          },
        )
        .then((r) => {
          const o = outcomes[kind] ?? {}
          o[r] = (o[r] ?? 0) + 1
          outcomes[kind] = o
          inFlight.delete(p)
        })
      inFlight.add(p)
    }
    if (now - lastReport > 15_000) {
      lastReport = now
      console.log(
        `  ${Math.round((now - t0) / 1000)} s: ~${rateAt(f, peak).toFixed(1)} req/s, ${inFlight.size} in flight`,
      )
    }
    await Bun.sleep(tickMs - ((Date.now() - t0) % tickMs))
  }
  await Promise.all(inFlight)
  return outcomes
}

async function startBatch(client: OpenAI, lines: number, tag: string): Promise<string> {
  const rows = Array.from({ length: lines }, (_, i) =>
    JSON.stringify({
      custom_id: `${tag}-${i}`,
      method: 'POST',
      url: '/v1/chat/completions',
      body: {
        model: i % 5 === 0 ? 'gigachat/gigachat-sim' : 'sim/chat-small',
        messages: [{ role: 'user', content: sentence(between(10, 80)) }],
        max_tokens: between(30, 90),
      },
    }),
  )
  const file = await client.files.create({
    file: await toFile(Buffer.from(`${rows.join('\n')}\n`), `${tag}.jsonl`),
    purpose: 'batch',
  })
  const batch = await client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
    metadata: { run: tag },
  })
  return batch.id
}

// ---------------------------------------------------------------------------------------------
// Prometheus

interface PromSeries {
  metric: Record<string, string>
  values: [number, string][]
}

async function queryRange(prom: string, expr: string, start: number, end: number, step: number) {
  const qs = new URLSearchParams({ query: expr, start: String(start), end: String(end), step: String(step) })
  const res = await fetch(`${prom}/api/v1/query_range?${qs}`)
  const body = (await res.json()) as {
    status: string
    error?: string
    warnings?: string[]
    data?: { resultType: string; result: PromSeries[] }
  }
  if (body.status !== 'success' || !body.data)
    throw new Error(`Prometheus refused ${expr}: ${body.error ?? res.status}`)
  if (body.warnings?.length) console.warn(`  warnings for ${expr}: ${body.warnings.join('; ')}`)
  return body.data.result
}

// ---------------------------------------------------------------------------------------------
// The page

/** Grafana's classic palette, in its order. */
const PALETTE = [
  '#7EB26D',
  '#EAB839',
  '#6ED0E0',
  '#EF843C',
  '#E24D42',
  '#1F78C1',
  '#BA43A9',
  '#705DA0',
  '#508642',
  '#CCA300',
  '#447EBC',
  '#C15C17',
  '#890F02',
  '#0A437C',
  '#6D1F62',
  '#584477',
  '#B7DBAB',
  '#F4D598',
  '#70DBED',
  '#F9BA8F',
  '#F29191',
  '#82B5D8',
  '#E5A8E2',
  '#AEA2E0',
]

interface Series {
  name: string
  values: (number | null)[]
}

interface Rendered {
  panel: Panel
  series: Series[]
}

/** Grafana's grid: 24 columns, rows of 30 px, 8 px between panels. */
const CELL_H = 30
const MARGIN = 8
const PAGE_W = 1600
const PAD = 16

const esc = (s: string) =>
  s.replace(
    /[&<>"']/g,
    (ch) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[ch]!,
  )

function box(g: GridPos) {
  const colW = (PAGE_W - 2 * PAD - 23 * MARGIN) / 24
  return {
    left: PAD + g.x * (colW + MARGIN),
    top: g.y * (CELL_H + MARGIN),
    width: g.w * colW + (g.w - 1) * MARGIN,
    height: g.h * CELL_H + (g.h - 1) * MARGIN,
  }
}

function sparkline(values: (number | null)[], color: string): string {
  const pts = values
    .map((v, i) => [i, v] as const)
    .filter((p): p is readonly [number, number] => p[1] !== null)
  if (pts.length < 2) return ''
  const max = Math.max(...pts.map((p) => p[1]), 1e-12)
  const n = values.length - 1
  const xy = pts.map(([i, v]) => `${((i / n) * 100).toFixed(2)},${(100 - (v / max) * 100).toFixed(2)}`)
  const first = pts[0]![0]
  const last = pts[pts.length - 1]![0]
  const area = `M${((first / n) * 100).toFixed(2)},100 L${xy.join(' L')} L${((last / n) * 100).toFixed(2)},100 Z`
  return `<svg class="spark" viewBox="0 0 100 100" preserveAspectRatio="none"><path d="${area}" fill="${color}" fill-opacity="0.18"/><path d="M${xy.join(' L')}" fill="none" stroke="${color}" stroke-width="1.5" vector-effect="non-scaling-stroke"/></svg>`
}

function renderPage(d: Dashboard, rendered: Rendered[], times: number[], from: Date, to: Date): string {
  const uplotJs = readFileSync(join(ROOT, 'node_modules/uplot/dist/uPlot.iife.min.js'), 'utf8')
  const uplotCss = readFileSync(join(ROOT, 'node_modules/uplot/dist/uPlot.min.css'), 'utf8')
  const bottom = Math.max(...rendered.map((r) => box(r.panel.gridPos).top + box(r.panel.gridPos).height))
  const charts: unknown[] = []
  const html: string[] = []
  for (const [i, { panel, series }] of rendered.entries()) {
    const b = box(panel.gridPos)
    const pos = `left:${b.left}px;top:${b.top}px;width:${b.width}px;height:${b.height}px`
    const unit = panel.fieldConfig?.defaults?.unit
    if (panel.type === 'row') {
      html.push(`<div class="row" style="${pos}"><span class="chev">⌄</span>${esc(panel.title)}</div>`)
      continue
    }
    if (panel.type === 'stat') {
      const s = series[0]
      const color = '#73BF69'
      const value = s ? formatValue(unit, lastNotNull(s.values)) : 'No data'
      html.push(
        `<div class="panel stat" style="${pos}"><div class="title">${esc(panel.title)}</div>` +
          `${s && panel.options?.graphMode !== 'none' ? sparkline(s.values, color) : ''}` +
          `<div class="big" style="color:${color}">${esc(value)}</div></div>`,
      )
      continue
    }
    const legend = series
      .map(
        (s, k) =>
          `<tr><td><span class="sw" style="background:${PALETTE[k % PALETTE.length]}"></span>${esc(s.name)}</td>` +
          `<td class="num">${esc(formatValue(unit, lastNotNull(s.values)))}</td></tr>`,
      )
      .join('')
    const right = panel.options?.legend?.placement === 'right'
    const compact = series.length > 18 ? ' compact' : ''
    html.push(
      `<div class="panel ts${right ? ' right' : ''}${compact}" style="${pos}"><div class="title">${esc(panel.title)}</div>` +
        `<div class="body"><div class="chart" id="c${i}">${series.length === 0 ? '<div class="nodata">No data</div>' : ''}</div>` +
        `<div class="legend"><table><thead><tr><th></th><th class="num">Last *</th></tr></thead><tbody>${legend}</tbody></table></div></div></div>`,
    )
    if (series.length === 0) continue
    const stacked = panel.fieldConfig?.defaults?.custom?.stacking?.mode === 'normal'
    const data: (number | null)[][] = []
    const acc: number[] = new Array(times.length).fill(0)
    for (const s of series) {
      if (!stacked) {
        data.push(s.values)
        continue
      }
      // As Grafana stacks: a missing value adds nothing to the stack.
      data.push(
        s.values.map((v, j) => {
          acc[j] = acc[j]! + (v ?? 0)
          return acc[j]!
        }),
      )
    }
    charts.push({
      id: `c${i}`,
      unit: unit ?? 'none',
      stacked,
      fill: (panel.fieldConfig?.defaults?.custom?.fillOpacity ?? 0) / 100,
      colors: series.map((_, k) => PALETTE[k % PALETTE.length]),
      data: [times, ...data],
    })
  }
  const fromTo = `${from.toISOString().slice(0, 19).replace('T', ' ')} to ${to.toISOString().slice(11, 19)} UTC`
  const payload = JSON.stringify(charts).replace(/</g, '\\u003c')
  return `<!doctype html><html><head><meta charset="utf-8"><title>${esc(d.title)}</title>
<style>${uplotCss}
*{box-sizing:border-box}
body{margin:0;background:#111217;color:#ccccdc;font:12px/1.4 Inter,"Helvetica Neue",Arial,sans-serif;width:${PAGE_W}px}
.top{display:flex;align-items:center;gap:16px;padding:12px ${PAD}px 8px;font-size:18px}
.top .crumb{color:rgba(204,204,220,.65)}
.top .range{margin-left:auto;font-size:12px;border:1px solid rgba(204,204,220,.2);border-radius:2px;padding:5px 10px}
.vars{display:flex;gap:8px;padding:0 ${PAD}px 12px}
.var{display:flex;font-size:12px}
.var span{border:1px solid rgba(204,204,220,.2);padding:5px 8px}
.var span:first-child{background:#22252b;color:#6e9fff;border-right:0}
.grid{position:relative;height:${bottom + PAD}px}
.row{position:absolute;font-size:15px;font-weight:500;display:flex;align-items:center;gap:6px;color:#ccccdc}
.row .chev{color:rgba(204,204,220,.65)}
.panel{position:absolute;background:#181b1f;border:1px solid rgba(204,204,220,.12);border-radius:2px;overflow:hidden;display:flex;flex-direction:column}
.title{font-size:13px;font-weight:500;padding:6px 8px 4px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.stat .big{position:absolute;inset:26px 8px 42% 8px;display:flex;align-items:center;justify-content:center;font-size:36px;font-weight:500}
.stat .spark{position:absolute;left:0;right:0;bottom:0;height:50%;width:100%}
.body{flex:1;display:flex;flex-direction:column;min-height:0;padding:0 8px 6px}
.right .body{flex-direction:row;gap:8px}
.chart{flex:1;min-width:0;min-height:0;position:relative}
.legend{overflow:hidden;font-size:11px}
.right .legend{max-width:48%}
.legend table{border-collapse:collapse;width:100%}
.legend th{font-weight:500;color:#6e9fff;text-align:right;padding:0 4px}
.legend td{padding:0 4px;line-height:13px;white-space:nowrap;max-width:330px;overflow:hidden;text-overflow:ellipsis}
.compact .legend td{font-size:10px;line-height:10.5px}
.num{text-align:right;font-variant-numeric:tabular-nums}
.sw{display:inline-block;width:12px;height:3px;border-radius:1px;margin-right:6px;vertical-align:middle}
.nodata{position:absolute;inset:0;display:flex;align-items:center;justify-content:center;color:rgba(204,204,220,.65);font-size:14px}
.foot{padding:4px ${PAD}px 12px;color:rgba(204,204,220,.5);font-size:11px}
</style></head><body>
<div class="top"><span class="crumb">Dashboards ›</span><span>${esc(d.title)}</span><span class="range">${esc(fromTo)}</span></div>
<div class="vars">${(d.templating?.list ?? [])
    .map(
      (v) =>
        `<div class="var"><span>${esc(v.name)}</span><span>${v.type === 'datasource' ? 'Prometheus' : 'All'}</span></div>`,
    )
    .join('')}</div>
<div class="grid">${html.join('\n')}</div>
<div class="foot">Prometheus 2.42 evaluating docs/observability/grafana-dashboard.json's own queries over a run of the demo fleet; drawn by scripts/dashboard-screenshot.ts with uPlot (Grafana is not installed here).</div>
<script>${uplotJs}</script>
<script>
${formatValue.toString()}
const CHARTS = ${payload};
for (const c of CHARTS) {
  const el = document.getElementById(c.id);
  const r = el.getBoundingClientRect();
  const alpha = (hex, a) => hex + Math.round(a * 255).toString(16).padStart(2, '0');
  const series = [{}].concat(c.colors.map((col) => ({
    stroke: col, width: 1.25, points: { show: false }, spanGaps: false,
    fill: c.fill > 0 ? alpha(col, c.fill) : undefined,
  })));
  const bands = c.stacked ? c.colors.slice(1).map((_, k) => ({ series: [k + 2, k + 1] })) : [];
  const axis = { stroke: 'rgba(204,204,220,.65)', grid: { stroke: 'rgba(204,204,220,.08)', width: 1 }, ticks: { show: false }, font: '11px Inter, Arial, sans-serif' };
  new uPlot({
    width: Math.floor(r.width), height: Math.floor(r.height),
    legend: { show: false }, cursor: { show: false }, bands,
    scales: { x: { time: true }, y: { range: (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.08 : 1] } },
    axes: [
      Object.assign({}, axis, { space: 70, values: (u, splits) => splits.map((t) => new Date(t * 1000).toISOString().slice(11, 19)) }),
      Object.assign({}, axis, { size: 62, values: (u, splits) => splits.map((v) => formatValue(c.unit, v)) }),
    ],
    series,
  }, c.data, el);
}
window.__drawn = true;
</script></body></html>`
}

// ---------------------------------------------------------------------------------------------
// Main

async function main() {
  const { values: args } = parseArgs({
    options: {
      minutes: { type: 'string', default: '3' },
      out: { type: 'string', default: 'docs/observability/dashboard.png' },
      step: { type: 'string', default: '2' },
      'rate-interval': { type: 'string', default: '15s' },
      'peak-rps': { type: 'string', default: '12' },
      html: { type: 'string' },
    },
    strict: true,
  })
  const minutes = Number(args.minutes)
  const step = Number(args.step)
  const peak = Number(args['peak-rps'])
  if (!(minutes > 0) || !(step > 0) || !(peak > 0))
    throw new Error('--minutes, --step and --peak-rps must be > 0')
  const out = resolve(args.out)
  const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as Dashboard

  // 1. The demo fleet here, Tropa as a child process with the demo's models.
  const dir = tempDir('tropa-dash-')
  const fleet = await startDemoFleet(3)
  cleanups.push(() => fleet.stop())
  const adminToken = `admin-${crypto.randomUUID()}`
  const configPath = join(dir, 'tropa.json')
  writeFileSync(
    configPath,
    JSON.stringify({
      server: { admin_token: adminToken, log_level: 'warn' },
      // Few lines at a time, so the batch panels move over more than a scrape or two.
      batches: { concurrency: 4 },
      models: demoModelFiles(fleet.nodes),
    }),
  )
  const port = freePort()
  const url = `http://127.0.0.1:${port}`
  const tropa = spawnChild(
    'tropa',
    [
      process.execPath,
      '--max-http-header-size=65536',
      join(ROOT, 'src/main.ts'),
      '--config',
      configPath,
      '--port',
      String(port),
      '--data-dir',
      join(dir, 'data'),
    ],
    join(dir, 'tropa.log'),
    DEMO_ENV,
  )
  await waitFor('Tropa', async () => (await fetch(`${url}/ready`)).ok, tropa.tail)
  const metrics = await fetch(`${url}/metrics`)
  if (!metrics.ok || !(await metrics.text()).includes('tropa_upstream_in_flight'))
    throw new Error(`GET /metrics answered ${metrics.status} without Tropa's metrics`)
  console.log(`tropa: ${url} (demo fleet: ${fleet.nodes.map((n) => n.name).join(', ')})`)

  const admin = async (path: string, token: string, body: unknown) => {
    const res = await fetch(`${url}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    })
    if (!res.ok) throw new Error(`POST ${path}: ${res.status} ${await res.text()}`)
    return (await res.json()) as Record<string, string>
  }
  const org = await admin('/v1/admin/organizations', adminToken, { name: 'demo', balance_rub: 1000 })
  const master = org.master_key!
  const key = (await admin('/v1/keys', master, { name: 'traffic' })).key!
  const limitedKey = (await admin('/v1/keys', master, { name: 'tiny limit', limit_rub: 0.5 })).key!
  const throttledKey = (await admin('/v1/keys', master, { name: 'low rpm', rpm_limit: 10 })).key!
  const sdk = (k: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: k, maxRetries: 0, timeout: 60_000 })
  const clients: Clients = {
    openai: sdk(key),
    anthropic: new Anthropic({ baseURL: url, apiKey: key, maxRetries: 0, timeout: 60_000 }),
    limited: sdk(limitedKey),
    throttled: sdk(throttledKey),
  }

  // 2. Prometheus scraping Tropa every second.
  const promDir = tempDir('prom-dash-')
  const promPort = freePort()
  const prom = `http://127.0.0.1:${promPort}`
  writeFileSync(
    join(promDir, 'prometheus.yml'),
    `global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tropa\n    static_configs:\n      - targets: ['127.0.0.1:${port}']\n`,
  )
  const prometheus = spawnChild(
    'prometheus',
    [
      PROMETHEUS,
      `--config.file=${join(promDir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(promDir, 'data')}`,
      `--web.listen-address=127.0.0.1:${promPort}`,
      '--log.level=warn',
    ],
    join(promDir, 'prometheus.log'),
    {},
  )
  await waitFor('Prometheus', async () => (await fetch(`${prom}/-/ready`)).ok, prometheus.tail)
  await waitFor(
    'the first scrape of Tropa',
    async () => {
      const r = (await (await fetch(`${prom}/api/v1/query?query=up`)).json()) as {
        data: { result: { value: [number, string] }[] }
      }
      return r.data.result[0]?.value[1] === '1'
    },
    prometheus.tail,
  )
  console.log(`prometheus: ${prom}, scraping ${url}/metrics every 1 s`)

  // 3. Traffic.
  const ms = minutes * 60_000
  const start = Math.floor(Date.now() / 1000) - 5
  const batches: Promise<string>[] = []
  const faults = { on: false, geminiBack: false, off: false, batch1: false, batch2: false }
  const sim3 = fleet.nodes.find((n) => n.name === 'sim-3')!
  const gemini = fleet.nodes.find((n) => n.name === 'gemini-sim')!
  console.log(`traffic for ${minutes} min, up to ~${peak} req/s`)
  const outcomes = await drive(clients, ms, peak, (f) => {
    if (!faults.batch1 && f >= 0.12) {
      faults.batch1 = true
      batches.push(startBatch(clients.openai, 240, 'first'))
    }
    if (!faults.on && f >= 0.4) {
      faults.on = true
      console.log('  sim-3 fails 60% of its requests, gemini-sim all of them')
      sim3.setFaults({ errorRate: 0.6 })
      gemini.setFaults({ errorRate: 1 })
    }
    if (!faults.geminiBack && f >= 0.5) {
      faults.geminiBack = true
      console.log('  gemini-sim answers again')
      gemini.setFaults({ errorRate: 0 })
    }
    if (!faults.off && f >= 0.55) {
      faults.off = true
      console.log('  sim-3 answers again')
      sim3.setFaults({ errorRate: 0 })
    }
    if (!faults.batch2 && f >= 0.45) {
      faults.batch2 = true
      batches.push(startBatch(clients.openai, 120, 'second'))
    }
  })
  const end = Math.floor(Date.now() / 1000)
  const batchIds = await Promise.all(batches)
  console.log('outcomes by kind (ok, HTTP status, aborted):')
  for (const [kind, o] of Object.entries(outcomes)) console.log(`  ${kind.padEnd(16)} ${JSON.stringify(o)}`)
  for (const id of batchIds) {
    const b = await clients.openai.batches.retrieve(id)
    console.log(`  batch ${id}: ${b.status}, ${JSON.stringify(b.request_counts)}`)
  }
  await Bun.sleep(2500) // the last scrapes

  // 4. Every panel's queries, as Grafana would send them with "All" selected.
  const vars = dashboardVars(dashboard, {
    interval: `${step}s`,
    rateInterval: args['rate-interval'],
    range: `${end - start}s`,
  })
  const times: number[] = []
  for (let t = start; t <= end; t += step) times.push(t)
  const rendered: Rendered[] = []
  const empty: string[] = []
  for (const panel of [...dashboard.panels].sort(
    (a, b) => a.gridPos.y - b.gridPos.y || a.gridPos.x - b.gridPos.x,
  )) {
    const series: Series[] = []
    for (const target of panel.targets ?? []) {
      if (!target.expr) continue
      const result = await queryRange(prom, substitute(target.expr, vars), start, end, step)
      for (const r of result.sort((a, b) =>
        legendName(target.legendFormat, a.metric).localeCompare(legendName(target.legendFormat, b.metric)),
      ))
        series.push({
          name: legendName(target.legendFormat, r.metric),
          values: onGrid(r.values, start, step, times.length),
        })
    }
    if (panel.type !== 'row') {
      const max = Math.max(0, ...series.flatMap((s) => s.values.map((v) => Math.abs(v ?? 0))))
      if (series.length === 0 || max === 0)
        empty.push(`${panel.title}: ${series.length === 0 ? 'no series' : 'all zero'}`)
    }
    rendered.push({ panel, series })
  }
  console.log(
    `evaluated ${rendered.reduce((n, r) => n + (r.panel.targets?.length ?? 0), 0)} queries of ${rendered.length} panels`,
  )
  if (empty.length > 0) console.log(`panels without a non-zero value:\n  ${empty.join('\n  ')}`)

  // 5. The page, and its screenshot.
  const html = renderPage(dashboard, rendered, times, new Date(start * 1000), new Date(end * 1000))
  if (args.html) writeFileSync(args.html, html)
  const browser = await launchChromium()
  cleanups.push(() => browser.close())
  const page = await browser.newPage({ viewport: { width: PAGE_W, height: 900 }, deviceScaleFactor: 1 })
  const problems: string[] = []
  page.on('pageerror', (e) => problems.push(e.message))
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(m.text())
  })
  page.on('request', (r) => {
    if (!r.url().startsWith('data:') && r.url() !== 'about:blank') problems.push(`request to ${r.url()}`)
  })
  await page.setContent(html, { waitUntil: 'load' })
  await page.waitForFunction('window.__drawn === true', undefined, { timeout: 15_000 })
  if (problems.length > 0) throw new Error(`the page went wrong:\n  ${problems.join('\n  ')}`)
  mkdirSync(dirname(out), { recursive: true })
  const png = await page.screenshot({ fullPage: true, path: out })
  console.log(`wrote ${out}: ${Math.round(png.length / 1024)} KB`)
}

if (import.meta.main) {
  let failed = false
  const onSignal = () => {
    console.error('interrupted: cleaning up')
    void cleanUp().then(() => process.exit(130))
  }
  process.on('SIGINT', onSignal)
  process.on('SIGTERM', onSignal)
  try {
    await main()
  } catch (err) {
    failed = true
    console.error(`dashboard-screenshot: ${(err as Error)?.stack ?? err}`)
  } finally {
    await cleanUp()
  }
  process.exit(failed ? 1 : 0)
}
