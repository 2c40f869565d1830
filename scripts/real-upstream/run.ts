#!/usr/bin/env bun
/**
 * run.ts — end-to-end check of Tropa against a REAL inference server.
 *
 *   bun scripts/real-upstream/run.ts            # full check: 2 llama nodes + Tropa
 *   bun scripts/real-upstream/run.ts --direct   # only the llama nodes, called directly
 *
 * Steps (full check):
 *   1. setup.sh: node-llama-cpp into .real-upstream/node_modules, model into
 *      .real-upstream/tiny.gguf (idempotent; --skip-setup to skip)
 *   2. start two llama-node.ts servers on free ports, wait for GET /health
 *   3. write a tropa.toml with one chat model "llama/tiny" routed to both
 *      nodes, start `bun src/main.ts --config ... --port P --data-dir D`
 *      with TROPA_ADMIN_TOKEN, wait for GET /health
 *   4. POST /v1/admin/organizations (admin token) -> master key;
 *      POST /v1/keys (master key) -> API key
 *   5. with the official `openai` client through Tropa: one streamed chat with
 *      stream_options.include_usage; check content arrived and usage is present;
 *      then a few more requests to see both nodes get traffic
 *   6. print timings: setup, model load, Tropa start, first token, total
 *
 * Exit code 0 when every check passed, 1 otherwise (what failed is printed,
 * with the tail of the failing process's log). All processes started are
 * stopped at exit; logs stay in the printed work directory.
 */
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { type Subprocess, spawn } from 'bun'
import OpenAI from 'openai'

const here = dirname(fileURLToPath(import.meta.url))
const repo = resolve(here, '..', '..')
const args = process.argv.slice(2)
const DIRECT = args.includes('--direct')
const SKIP_SETUP = args.includes('--skip-setup')
const KEEP = args.includes('--keep') // leave processes running (Ctrl-C to stop)
const DIR = process.env.REAL_UPSTREAM_DIR ?? join(repo, '.real-upstream')
const MODEL = process.env.REAL_UPSTREAM_MODEL ?? join(DIR, 'tiny.gguf')
const work = mkdtempSync(join(tmpdir(), 'tropa-real-upstream-'))

const t0 = performance.now()
const ms = (a: number, b = performance.now()) => `${(b - a).toFixed(0)} ms`
const timings: [string, string][] = []
const results: { name: string; ok: boolean; detail: string }[] = []
const procs: { name: string; proc: Subprocess; log: string }[] = []

function check(name: string, ok: boolean, detail = '') {
  results.push({ name, ok, detail })
  console.log(`${ok ? 'PASS' : 'FAIL'}  ${name}${detail ? `  (${detail})` : ''}`)
  return ok
}

function tail(file: string, lines = 30): string {
  try {
    return readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n')
  } catch {
    return '(no log)'
  }
}

async function freePort(): Promise<number> {
  const s = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const p = s.port
  s.stop(true)
  return p
}

function start(name: string, cmd: string[], env: Record<string, string> = {}) {
  const log = join(work, `${name}.log`)
  const errLog = join(work, `${name}.err.log`)
  const proc = spawn({
    cmd,
    cwd: repo,
    env: { ...process.env, ...env },
    stdout: Bun.file(log),
    stderr: Bun.file(errLog),
  })
  procs.push({ name, proc, log })
  return { proc, log, errLog }
}

type Health = { load_ms?: number; binding_ms?: number }

async function waitHealthy(name: string, url: string, proc: Subprocess, timeoutMs = 60_000): Promise<Health> {
  const t = performance.now()
  while (performance.now() - t < timeoutMs) {
    if (proc.exitCode !== null)
      throw new Error(`${name} exited with code ${proc.exitCode} before becoming healthy`)
    try {
      const r = await fetch(url, { signal: AbortSignal.timeout(1000) })
      if (r.status === 200) return (await r.json().catch(() => ({}))) as Health
    } catch {}
    await Bun.sleep(50)
  }
  throw new Error(`${name} not healthy at ${url} after ${timeoutMs} ms`)
}

async function stopAll() {
  for (const { proc } of procs.reverse()) {
    if (proc.exitCode === null) proc.kill('SIGTERM')
  }
  await Promise.race([Promise.all(procs.map((p) => p.proc.exited)), Bun.sleep(3000)])
  for (const { proc } of procs) if (proc.exitCode === null) proc.kill('SIGKILL')
}

type StreamStats = {
  content: string
  chunks: number
  ttftMs: number
  totalMs: number
  usage?: OpenAI.CompletionUsage | null
  finish?: string | null
  usageChunkHadNoChoices: boolean
  headers?: Headers
}

async function streamChat(
  client: OpenAI,
  model: string,
  maxTokens: number,
  prompt = 'Say hi to the router',
): Promise<StreamStats> {
  const s = performance.now()
  const { data: stream, response } = await client.chat.completions
    .create({
      model,
      messages: [{ role: 'user', content: prompt }],
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: maxTokens,
    })
    .withResponse()
  let content = ''
  let chunks = 0
  let ttftMs = -1
  let usage: OpenAI.CompletionUsage | null | undefined
  let finish: string | null | undefined
  let usageChunkHadNoChoices = false
  for await (const chunk of stream) {
    chunks++
    const delta = chunk.choices[0]?.delta?.content
    if (delta && ttftMs < 0) ttftMs = performance.now() - s
    if (delta) content += delta
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason
    if (chunk.usage) {
      usage = chunk.usage
      usageChunkHadNoChoices = chunk.choices.length === 0
    }
  }
  return {
    content,
    chunks,
    ttftMs,
    totalMs: performance.now() - s,
    usage,
    finish,
    usageChunkHadNoChoices,
    headers: response.headers,
  }
}

async function main() {
  // 1. setup -------------------------------------------------------------
  if (!SKIP_SETUP) {
    const s = performance.now()
    const r = Bun.spawnSync({
      cmd: ['bash', join(here, 'setup.sh')],
      cwd: repo,
      stdout: 'inherit',
      stderr: 'inherit',
    })
    timings.push(['setup (install if needed + model generation)', ms(s)])
    if (!check('setup.sh', r.exitCode === 0, `exit ${r.exitCode}`)) return
  }
  if (!check('model file exists', existsSync(MODEL), MODEL)) return

  // 2. two llama nodes -----------------------------------------------------
  const ports = [await freePort(), await freePort()]
  const sLoad = performance.now()
  const nodes = ports.map((port, i) =>
    start(`llama-${i === 0 ? 'a' : 'b'}`, [
      'bun',
      join(here, 'llama-node.ts'),
      '--port',
      String(port),
      '--model',
      MODEL,
    ]),
  )
  const health = await Promise.all(
    nodes.map((n, i) => waitHealthy(`llama node ${i}`, `http://127.0.0.1:${ports[i]}/health`, n.proc)),
  ).catch((e) => {
    check('llama nodes healthy', false, String(e.message))
    for (const n of nodes) console.log(`--- ${n.log}\n${tail(n.log)}\n--- ${n.errLog}\n${tail(n.errLog)}`)
    return null
  })
  if (!health) return
  timings.push(['2 llama nodes: spawn -> healthy (wall, in parallel)', ms(sLoad)])
  timings.push([
    'llama node in-process load (getLlama + loadModel + createContext)',
    health.map((h) => `${h.load_ms} ms (binding ${h.binding_ms} ms)`).join(', '),
  ])
  check('llama nodes healthy', true, `ports ${ports.join(', ')}`)

  if (DIRECT) return await direct(ports)

  // 3. Tropa -----------------------------------------------------------------
  if (!existsSync(join(repo, 'src', 'main.ts'))) {
    check('Tropa present (src/main.ts)', false, 'not built yet; run with --direct to check the nodes alone')
    return
  }
  const tropaPort = await freePort()
  const adminToken = `rt-admin-${crypto.randomUUID()}`
  const cfg = join(work, 'tropa.toml')
  writeFileSync(
    cfg,
    `[[models]]
id = "llama/tiny"
owned_by = "llama"
kind = "chat"
context_length = 2048
[models.pricing]
prompt = "0.000030"
completion = "0.000060"
${ports
  .map(
    (p) => `[[models.routes]]
base_url = "http://127.0.0.1:${p}/v1"
upstream_model = "tiny"
max_concurrency = 4
`,
  )
  .join('')}`,
  )
  const sTropa = performance.now()
  const tropa = start(
    'tropa',
    [
      'bun',
      'src/main.ts',
      '--config',
      cfg,
      '--port',
      String(tropaPort),
      '--data-dir',
      join(work, 'tropa-data'),
    ],
    { TROPA_ADMIN_TOKEN: adminToken },
  )
  try {
    await waitHealthy('tropa', `http://127.0.0.1:${tropaPort}/health`, tropa.proc, 30_000)
  } catch (e) {
    check('tropa healthy', false, String((e as Error).message))
    console.log(`--- ${tropa.log}\n${tail(tropa.log)}\n--- ${tropa.errLog}\n${tail(tropa.errLog)}`)
    return
  }
  timings.push(['tropa: spawn -> healthy', ms(sTropa)])
  check('tropa healthy', true, `port ${tropaPort}`)
  const tropaUrl = `http://127.0.0.1:${tropaPort}`

  // 4. org + key ------------------------------------------------------------
  const orgRes = await fetch(`${tropaUrl}/v1/admin/organizations`, {
    method: 'POST',
    headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'llama-test', balance_rub: 100 }),
  })
  const org = (await orgRes.json().catch(() => ({}))) as { id?: string; master_key?: string }
  if (
    !check(
      'create organization',
      orgRes.status === 201 && !!org.master_key,
      `HTTP ${orgRes.status} ${JSON.stringify({ ...org, master_key: org.master_key ? '<secret>' : undefined }).slice(0, 200)}`,
    )
  )
    return
  const keyRes = await fetch(`${tropaUrl}/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${org.master_key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'k' }),
  })
  const key = (await keyRes.json().catch(() => ({}))) as { key?: string; key_id?: string }
  if (
    !check(
      'create API key',
      keyRes.status === 201 && !!key.key,
      `HTTP ${keyRes.status} ${JSON.stringify({ ...key, key: key.key ? '<secret>' : undefined }).slice(0, 200)}`,
    )
  )
    return

  // 5. streamed chat through Tropa -------------------------------------------
  const client = new OpenAI({ apiKey: key.key!, baseURL: `${tropaUrl}/v1`, maxRetries: 0, timeout: 30_000 })
  let st: StreamStats
  try {
    st = await streamChat(client, 'llama/tiny', 32)
  } catch (e) {
    check('streamed chat through Tropa', false, String((e as Error).message))
    console.log(`--- ${tropa.errLog}\n${tail(tropa.errLog)}`)
    return
  }
  check(
    'content arrived through Tropa',
    st.content.length > 0,
    `${st.content.length} chars, ${st.chunks} chunks: ${JSON.stringify(st.content.slice(0, 60))}`,
  )
  check(
    'usage present through Tropa',
    !!st.usage &&
      st.usage.prompt_tokens > 0 &&
      st.usage.completion_tokens > 0 &&
      st.usage.completion_tokens <= 32,
    JSON.stringify(st.usage),
  )
  check('usage chunk has choices: []', st.usageChunkHadNoChoices)
  check('finish_reason present', !!st.finish, String(st.finish))
  // Information, not a check: Tropa caps a charge at its reservation, which it sizes with its own
  // prompt-token estimate; a real upstream's tokenizer may count more, then cost_rub < usage x price.
  const cost = (st.usage as { cost_rub?: number } | null | undefined)?.cost_rub
  if (st.usage && typeof cost === 'number') {
    const expect = st.usage.prompt_tokens * 0.00003 + st.usage.completion_tokens * 0.00006
    const same = Math.abs(cost - expect) < 1e-9
    console.log(
      `INFO  cost_rub ${cost} vs usage x price ${expect.toFixed(6)}${same ? ' (equal)' : " (differs: charge capped at Tropa's reservation?)"}`,
    )
  }
  timings.push(['first token through Tropa (first request)', `${st.ttftMs.toFixed(1)} ms`])
  timings.push(['streamed request through Tropa, 32 max tokens', `${st.totalMs.toFixed(1)} ms`])
  const node = st.headers?.get('x-tropa-node')
  if (node) console.log(`      served by node ${node}`)

  // a warm request, and traffic spread over both nodes
  const warm = await streamChat(client, 'llama/tiny', 32)
  timings.push(['first token through Tropa (warm)', `${warm.ttftMs.toFixed(1)} ms`])
  timings.push(['streamed request through Tropa (warm)', `${warm.totalMs.toFixed(1)} ms`])
  await Promise.all(Array.from({ length: 8 }, () => streamChat(client, 'llama/tiny', 16).catch(() => null)))
  const per = await Promise.all(
    ports.map(
      async (p) =>
        ((await (await fetch(`http://127.0.0.1:${p}/health`)).json()) as { requests_total: number })
          .requests_total,
    ),
  )
  check(
    'both nodes served requests',
    per.every((n) => n > 0),
    `requests per node: ${per.join(', ')}`,
  )

  // the organization was charged
  const orgNow = await fetch(`${tropaUrl}/v1/admin/organizations/${org.id}`, {
    headers: { authorization: `Bearer ${adminToken}` },
  }).then((r) => r.json().catch(() => ({})))
  console.log(`      organization after the run: ${JSON.stringify(orgNow)}`)
}

async function direct(ports: number[]) {
  for (const [i, port] of ports.entries()) {
    const client = new OpenAI({ apiKey: 'unused', baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 })
    const models = await client.models.list()
    check(
      `node ${i}: GET /v1/models`,
      models.data.some((m) => m.id === 'tiny'),
      models.data.map((m) => m.id).join(','),
    )
    const st = await streamChat(client, 'tiny', 32)
    check(`node ${i}: streamed content`, st.content.length > 0, JSON.stringify(st.content.slice(0, 50)))
    check(
      `node ${i}: streamed usage`,
      !!st.usage && st.usage.prompt_tokens > 0 && st.usage.completion_tokens > 0 && st.usageChunkHadNoChoices,
      JSON.stringify(st.usage),
    )
    const r = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'count' }],
      max_tokens: 8,
    })
    check(
      `node ${i}: non-streamed max_tokens=8`,
      r.usage?.completion_tokens === 8
        ? r.choices[0]?.finish_reason === 'length'
        : r.choices[0]?.finish_reason === 'stop',
      `finish ${r.choices[0]?.finish_reason}, usage ${JSON.stringify(r.usage)}`,
    )
    if (i === 0)
      timings.push([`node ${i}: first token (first request, direct)`, `${st.ttftMs.toFixed(1)} ms`])
  }
  // speed: a long generation, ms per token as seen by the client
  const client = new OpenAI({ apiKey: 'unused', baseURL: `http://127.0.0.1:${ports[0]}/v1`, maxRetries: 0 })
  const long = await streamChat(client, 'tiny', 200)
  const n = long.usage?.completion_tokens ?? 0
  timings.push(['direct: first token (warm)', `${long.ttftMs.toFixed(1)} ms`])
  timings.push([
    `direct: ${n} tokens streamed`,
    `${long.totalMs.toFixed(1)} ms total, ${n > 1 ? ((long.totalMs - long.ttftMs) / (n - 1)).toFixed(2) : '?'} ms/token after the first`,
  ])
  // concurrency: 12 requests at once on a node with 4 sequences (8 wait in its queue)
  const s = performance.now()
  const many = await Promise.all(
    Array.from({ length: 12 }, () => streamChat(client, 'tiny', 50).catch((e) => e as Error)),
  )
  const okN = many.filter((m) => !(m instanceof Error) && m.content.length > 0 && m.usage).length
  const toks = many.reduce((a, m) => a + (m instanceof Error ? 0 : (m.usage?.completion_tokens ?? 0)), 0)
  check('12 concurrent streamed requests on one node', okN === 12, `${okN}/12 ok, ${toks} tokens in ${ms(s)}`)
  timings.push([
    'direct: 12 concurrent x 50 tokens',
    `${ms(s)} (${((toks / (performance.now() - s)) * 1000).toFixed(0)} tokens/s)`,
  ])
}

try {
  await main()
} catch (e) {
  check('unexpected error', false, String((e as Error)?.stack ?? e))
} finally {
  timings.push(['total', ms(t0)])
  console.log('\nTimings')
  for (const [k, v] of timings) console.log(`  ${k.padEnd(66)} ${v}`)
  const failed = results.filter((r) => !r.ok)
  console.log(`\nlogs: ${work}`)
  console.log(`${results.length - failed.length} passed, ${failed.length} failed`)
  if (KEEP) {
    console.log('--keep: processes left running; Ctrl-C to stop')
    process.on('SIGINT', async () => {
      await stopAll()
      process.exit(0)
    })
  } else {
    await stopAll()
    process.exit(failed.length ? 1 : 0)
  }
}
