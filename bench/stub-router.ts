/**
 * What the HTTP benchmarks of one router against a stub upstream share (variants-http.ts,
 * workers.ts): the stub (a process answering every chat request at once with a fixed 16-token
 * completion), a router of a source tree as a process with its config, an organization and key
 * on it, and config merging. request-path.ts merges configs the same way, in-process.
 */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { cpuUs } from './proc.ts'

export const ADMIN = 'bench-admin-token-0123456789abcdef'
export const REPLY = JSON.stringify({
  id: 'chatcmpl-sim-1',
  object: 'chat.completion',
  created: 1764000000,
  model: 'chat-small',
  choices: [
    { index: 0, message: { role: 'assistant', content: 'Routers queue requests.' }, finish_reason: 'length' },
  ],
  usage: { prompt_tokens: 16, completion_tokens: 16, total_tokens: 32 },
})

// biome-ignore lint/suspicious/noExplicitAny: a config fragment of any shape
type Any = any

const PROMPT_WORDS = 'routers queue requests while the nodes answer them in turn and bill each one once '

/**
 * The benches' chat request (`bench/fast`, 16 tokens out), its prompt a short question or, with
 * promptBytes, that many bytes of English words; `extra` fields added.
 */
export function benchChatBody(promptBytes = 0, extra: Record<string, unknown> = {}): string {
  const content =
    promptBytes > 0
      ? PROMPT_WORDS.repeat(Math.ceil(promptBytes / PROMPT_WORDS.length)).slice(0, promptBytes)
      : 'Say something short about routers and queues.'
  return JSON.stringify({
    model: 'bench/fast',
    messages: [{ role: 'user', content }],
    max_tokens: 16,
    ...extra,
  })
}

/** `base` with `extra` merged in, objects key by key (arrays and values replaced). */
export function merged(base: Any, extra: Any): Any {
  if (typeof extra !== 'object' || extra === null || Array.isArray(extra)) return extra
  const out = { ...base }
  for (const [k, v] of Object.entries(extra)) out[k] = merged(base?.[k], v)
  return out
}

/** A port free right now. */
export function freePort(): number {
  const s = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response() })
  const p = s.port!
  s.stop(true)
  return p
}

/** The stream the stub sends for `"stream": true`: 16 one-token chunks, a usage chunk, [DONE]. */
export const STREAM = `${Array.from(
  { length: 16 },
  (_, i) =>
    `data: ${JSON.stringify({ id: 'chatcmpl-sim-1', object: 'chat.completion.chunk', created: 1764000000, model: 'chat-small', choices: [{ index: 0, delta: i === 0 ? { role: 'assistant', content: 'word ' } : { content: 'word ' }, finish_reason: null }] })}\n\n`,
).join(
  '',
)}data: ${JSON.stringify({ id: 'chatcmpl-sim-1', object: 'chat.completion.chunk', created: 1764000000, model: 'chat-small', choices: [{ index: 0, delta: {}, finish_reason: 'length' }], usage: { prompt_tokens: 16, completion_tokens: 16, total_tokens: 32 } })}\n\ndata: [DONE]\n\n`

/**
 * The stub upstream, a process of its own (so its work is not the router's): a chat request is
 * answered at once with REPLY, or with STREAM when its body asks for a stream.
 */
export function startStub(dir: string): { port: number; proc: ReturnType<typeof Bun.spawn> } {
  const port = freePort()
  const file = join(dir, 'stub.ts')
  writeFileSync(
    file,
    `const REPLY = ${JSON.stringify(REPLY)}, STREAM = ${JSON.stringify(STREAM)}
Bun.serve({ port: ${port}, hostname: '127.0.0.1', fetch: async (r) => {
  if (!new URL(r.url).pathname.endsWith('/chat/completions')) return new Response('{"data":[]}')
  return (await r.text()).includes('"stream":true')
    ? new Response(STREAM, { headers: { 'content-type': 'text/event-stream' } })
    : new Response(REPLY, { headers: { 'content-type': 'application/json' } })
} })`,
  )
  return { port, proc: Bun.spawn([process.execPath, file], { stdout: 'ignore', stderr: 'inherit' }) }
}

/** The bench's router config: one model, bench/fast, on the stub; `extra` merged in. */
export function routerConfig(port: number, dataDir: string, stubPort: number, extra: Any = {}): Any {
  return merged(
    {
      server: {
        host: '127.0.0.1',
        port,
        data_dir: dataDir,
        log_level: 'error',
        admin_token: ADMIN,
        workers: 1,
      },
      storage: { ledger_queue_max: 5_000_000 },
      models: [
        {
          id: 'bench/fast',
          context_length: 8192,
          pricing_per_million: { prompt: '30', completion: '60' },
          routes: [
            {
              name: 'stub',
              base_url: `http://127.0.0.1:${stubPort}/v1`,
              upstream_model: 'chat-small',
              max_concurrency: 100_000,
            },
          ],
        },
      ],
    },
    extra,
  )
}

/**
 * A router of `tree` (a source tree) on `config`, as a process; resolved once `ready()` holds and
 * an organization with a key exists on it.
 */
export async function startRouter(o: {
  tree: string
  config: Any
  configPath: string
  env?: Record<string, string>
  ready?: (proc: ReturnType<typeof Bun.spawn>) => boolean
  /** Flags for Bun itself (`--cpu-prof`, ...). */
  bunFlags?: string[]
  /** A file for the router's stderr (default: this process's stderr). */
  stderrFile?: string
}) {
  writeFileSync(o.configPath, JSON.stringify(o.config))
  const proc = Bun.spawn(
    [
      process.execPath,
      '--max-http-header-size=65536',
      ...(o.bunFlags ?? []),
      join(o.tree, 'src/main.ts'),
      '--config',
      o.configPath,
    ],
    {
      stdout: 'ignore',
      stderr: o.stderrFile ? Bun.file(o.stderrFile) : 'inherit',
      env: { PATH: process.env.PATH ?? '', ...o.env },
    },
  )
  const url = `http://${o.config.server.host}:${o.config.server.port}`
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${url}/ready`)).ok && (o.ready?.(proc) ?? true)) break
    } catch {}
    if (i > 2000) throw new Error('router did not start')
    await Bun.sleep(10)
  }
  const post = (path: string, token: string, b: unknown) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify(b),
    }).then((r) => r.json() as Promise<Record<string, string>>)
  const org = await post('/v1/admin/organizations', ADMIN, { name: 'b', balance_rub: 10_000_000 })
  const key = (await post('/v1/keys', org.master_key!, { name: 'k' })).key!
  return { proc, url, key }
}

/** CPU time (us) per thread name of a process: `loop` for its main thread. */
export function threadTimes(pid: number): Map<string, number> {
  const out = new Map<string, number>()
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      const name = Number(t) === pid ? 'loop' : readFileSync(`/proc/${pid}/task/${t}/comm`, 'utf8').trim()
      out.set(name, (out.get(name) ?? 0) + cpuUs(pid, Number(t)))
    } catch {
      // a thread that ended
    }
  }
  return out
}

/**
 * `conns` connections each sending `body` to `url` one request after another for `ms`; throws on
 * an answer `ok` refuses (default: any status but 200). Returns the requests answered.
 */
export async function hammer(
  url: string,
  headers: Record<string, string>,
  body: string,
  conns: number,
  ms: number,
  ok: (status: number, text: string) => boolean = (status) => status === 200,
): Promise<number> {
  const until = performance.now() + ms
  let n = 0
  await Promise.all(
    Array.from({ length: conns }, async () => {
      while (performance.now() < until) {
        const res = await fetch(url, { method: 'POST', headers, body })
        const text = await res.text()
        if (!ok(res.status, text)) throw new Error(`${res.status} ${text.slice(0, 300)}`)
        n++
      }
    }),
  )
  return n
}
