// The schema-driven fuzzer's runner: N generated requests against a running Tropa, each answer
// checked (no 5xx, OpenAI's error shape with the status its type implies), latency recorded.
//
//   bun bench/fuzz/run.ts --count 1000000 --seed 7      # starts Tropa in-process on a fast fleet
//
// test/hardening/fuzz.test.ts runs it with 100,000 requests and a fixed seed, and also checks
// the process's memory, the log and the ledger afterwards.
import { LatencyHistogram, type LatencySummary } from '../histogram.ts'
import { type Credential, nextRequest, operationsOf, Rng, type Secrets, type Target } from './gen.ts'

/** The error type each status must carry (src/errors.ts). */
const TYPE_OF_STATUS: Record<number, string[]> = {
  400: ['invalid_request_error'],
  401: ['authentication_error'],
  402: ['insufficient_quota'],
  403: ['permission_error'],
  404: ['not_found_error'],
  405: ['invalid_request_error'],
  409: ['conflict_error'],
  413: ['invalid_request_error'],
  415: ['invalid_request_error'],
  429: ['rate_limit_error'],
}

export interface FuzzOptions {
  url: string
  secrets: Secrets
  target: Target
  seed: number
  count: number
  concurrency?: number
  /** A request (headers and body) not answered within this is a violation (default 10 s). */
  timeoutMs?: number
  /** Called for each 2xx answer of a billed endpoint with its x-request-id. */
  onBilled?: (requestId: string) => void
}

export interface Violation {
  kind: string
  method: string
  path: string
  status: number
  why: string
  body: string
}

export interface FuzzReport {
  count: number
  byStatus: Record<number, number>
  byKind: Record<string, number>
  latency: LatencySummary
  /** The slowest requests, for the report. */
  slowest: { ms: number; kind: string; method: string; path: string; status: number }[]
  violations: Violation[]
  billed: number
}

const BILLED = new Set([
  '/v1/chat/completions',
  '/v1/embeddings',
  '/v1/messages',
  '/v1/completions',
  '/v1/responses',
])

/** The Anthropic error type each status must carry on /v1/messages* (src/http/error-mapper.ts). */
const ANTHROPIC_TYPE_OF_STATUS: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'billing_error',
  403: 'permission_error',
  404: 'not_found_error',
  405: 'invalid_request_error',
  409: 'conflict_error',
  413: 'request_too_large',
  415: 'invalid_request_error',
  429: 'rate_limit_error',
}

export async function runFuzz(opts: FuzzOptions): Promise<FuzzReport> {
  const doc = (await (await fetch(`${opts.url}/docs/json`)).json()) as Parameters<typeof operationsOf>[0]
  const ops = operationsOf(doc).filter((o) => o.method !== 'GET' || !o.path.startsWith('/docs'))
  const rng = new Rng(opts.seed)
  const hist = new LatencyHistogram()
  const report: FuzzReport = {
    count: 0,
    byStatus: {},
    byKind: {},
    latency: hist.summary(),
    slowest: [],
    violations: [],
    billed: 0,
  }
  const secretOf = (c: Credential): string | undefined =>
    c === 'none'
      ? undefined
      : c === 'bogus'
        ? 'sk-bogus0000000000000000000000000000000000000'
        : opts.secrets[c]
  let issued = 0
  const worker = async () => {
    while (issued < opts.count) {
      issued++
      const req = nextRequest(ops, rng, opts.target)
      const secret = secretOf(req.cred)
      const headers: Record<string, string> = { ...req.headers }
      if (secret) headers.authorization = `Bearer ${secret}`
      const t0 = performance.now()
      let status = 0
      let text = ''
      let contentType = ''
      let requestId = ''
      try {
        const res = await fetch(`${opts.url}${req.path}`, {
          method: req.method,
          headers,
          signal: AbortSignal.timeout(opts.timeoutMs ?? 10_000),
          ...(req.body !== undefined && req.method !== 'GET' && req.method !== 'HEAD' && { body: req.body }),
        })
        status = res.status
        contentType = res.headers.get('content-type') ?? ''
        requestId = res.headers.get('x-request-id') ?? ''
        // Time to answer: the status line and headers (a stream's body is read after).
        const ms = performance.now() - t0
        hist.recordMs(ms)
        keepSlowest(report, { ms, kind: req.kind, method: req.method, path: req.path.slice(0, 80), status })
        if (process.env.FUZZ_SLOW && ms > Number(process.env.FUZZ_SLOW))
          console.error(
            JSON.stringify({
              ms: Math.round(ms),
              kind: req.kind,
              m: req.method,
              p: req.path.slice(0, 60),
              status,
              bytes: req.body?.length ?? 0,
            }),
          )
        text = await res.text()
      } catch (err) {
        report.violations.push({
          kind: req.kind,
          method: req.method,
          path: req.path.slice(0, 200),
          status: 0,
          why: `no HTTP answer: ${(err as Error).message}`,
          body: '',
        })
        continue
      }
      report.count++
      if (process.env.FUZZ_PROGRESS && report.count % 5000 === 0) console.error(`${report.count} answered`)
      report.byStatus[status] = (report.byStatus[status] ?? 0) + 1
      report.byKind[req.kind] = (report.byKind[req.kind] ?? 0) + 1
      const why = judge(status, contentType, text, req.method, req.path)
      if (why)
        report.violations.push({
          kind: req.kind,
          method: req.method,
          path: req.path.slice(0, 200),
          status,
          why,
          body: text.slice(0, 300),
        })
      const path = req.path.split('?')[0]!.replace(/(.)\/+$/, '$1')
      if (status >= 200 && status < 300 && req.method === 'POST' && BILLED.has(path)) {
        report.billed++
        opts.onBilled?.(requestId)
      }
    }
  }
  await Promise.all(Array.from({ length: opts.concurrency ?? 16 }, worker))
  report.latency = hist.summary()
  return report
}

function keepSlowest(r: FuzzReport, s: FuzzReport['slowest'][number]): void {
  if (r.slowest.length < 10) r.slowest.push(s)
  else if (s.ms > r.slowest[9]!.ms) r.slowest[9] = s
  else return
  r.slowest.sort((a, b) => b.ms - a.ms)
}

/** Why an answer breaks the contract, or undefined. */
export function judge(
  status: number,
  contentType: string,
  text: string,
  method: string,
  path = '',
): string | undefined {
  if (status >= 500) return `status ${status}`
  if (status < 400) return undefined
  if (method === 'HEAD') return undefined
  if (!contentType.startsWith('application/json'))
    return `error with content-type ${JSON.stringify(contentType)}`
  if (/^\/v1\/messages(\/|\?|$)/.test(path)) return judgeAnthropic(status, text)
  let body: { error?: { message?: unknown; type?: unknown; param?: unknown; code?: unknown } }
  try {
    body = JSON.parse(text)
  } catch {
    return 'error body is not JSON'
  }
  const e = body.error
  if (!e || typeof e !== 'object') return 'no error object'
  if (typeof e.message !== 'string' || e.message.length === 0) return 'error.message is not a string'
  if (typeof e.type !== 'string') return 'error.type is not a string'
  if (!(e.param === null || typeof e.param === 'string')) return 'error.param is neither null nor a string'
  if (!(e.code === null || typeof e.code === 'string')) return 'error.code is neither null nor a string'
  if (e.message.length > 2000) return 'error.message is over 2,000 characters (echoes input?)'
  const types = TYPE_OF_STATUS[status]
  if (types && !types.includes(e.type)) return `status ${status} with type ${e.type}`
  return undefined
}

/** judge for the Messages API's paths: Anthropic's `{"type":"error","error":{type,message}}`. */
function judgeAnthropic(status: number, text: string): string | undefined {
  let body: { type?: unknown; error?: { message?: unknown; type?: unknown } }
  try {
    body = JSON.parse(text)
  } catch {
    return 'error body is not JSON'
  }
  if (body.type !== 'error') return 'type is not "error"'
  const e = body.error
  if (!e || typeof e !== 'object') return 'no error object'
  if (typeof e.message !== 'string' || e.message.length === 0) return 'error.message is not a string'
  if (e.message.length > 2000) return 'error.message is over 2,000 characters (echoes input?)'
  const type = ANTHROPIC_TYPE_OF_STATUS[status]
  if (type && e.type !== type) return `status ${status} with type ${String(e.type)}`
  return undefined
}

if (import.meta.main) {
  const { parseArgs } = await import('node:util')
  const { values } = parseArgs({
    options: {
      count: { type: 'string', default: '100000' },
      seed: { type: 'string', default: '1' },
      concurrency: { type: 'string', default: '16' },
    },
  })
  const { startFuzzTarget } = await import('./target.ts')
  const t = await startFuzzTarget()
  const billed = new Set<string>()
  const rssBefore = t.rss()
  const t0 = performance.now()
  const report = await runFuzz({
    url: t.url,
    secrets: t.secrets,
    target: t.target,
    seed: Number(values.seed),
    count: Number(values.count),
    concurrency: Number(values.concurrency),
    onBilled: (id) => billed.add(id),
  })
  const seconds = (performance.now() - t0) / 1000
  // Memory once the load has gone: a few seconds for the allocator to give pages back.
  await Bun.sleep(3000)
  const rssAfter = t.rss()
  const stderr = await t.stop()
  const ledger = t.ledger()
  const unbilled = [...ledger.usage.keys()].filter((id) => !billed.has(id)).length
  const unrecorded = [...billed].filter((id) => !ledger.usage.has(id)).length
  let spent = 0n
  for (const c of ledger.usage.values()) spent += c
  console.log(
    JSON.stringify(
      {
        ...report,
        violations: report.violations.slice(0, 20),
        violationCount: report.violations.length,
        seconds,
        requestsPerSecond: report.count / seconds,
        rssMiB: { before: rssBefore / 2 ** 20, after: rssAfter / 2 ** 20 },
        ledger: {
          rows: ledger.usage.size,
          billedAnswers: billed.size,
          rowsWithoutAnAnswer: unbilled,
          answersWithoutARow: unrecorded,
          balanceConsistent: ledger.balanceNano === ledger.credits - spent,
        },
        stderrLines: stderr.split('\n').filter(Boolean).slice(0, 20),
      },
      null,
      2,
    ),
  )
  await t.cleanup()
  process.exit(report.violations.length === 0 && unbilled === 0 && unrecorded === 0 ? 0 : 1)
}
