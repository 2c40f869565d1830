/**
 * `bun bench/receipts-http.ts [--rounds N] [--seconds S] [--conns C]`: what signing every billed
 * response (receipts.responses) costs a router over real HTTP. Two routers of this tree run as
 * processes side by side, with it and without (TROPA_RECEIPTS_RESPONSES; receipts.enabled, the
 * default, on both), in front of one stub upstream (a process answering every chat request at
 * once with a fixed 16-token completion); a load process of C connections (default 32) alternates
 * between them round after round (on, off, off, on, ...). Per request: each router's event-loop
 * CPU (its main thread, from /proc) and its other threads' (the receipt thread's, mostly); the ratio on/off from each round's
 * pair. Complements bench/request-path.ts, whose in-process requests never leave the microtask
 * queue: there any await of another thread (or a mere setImmediate) costs a loop turn per
 * request that a served request, which waits for sockets anyway, does not pay.
 */
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'

const { values } = parseArgs({
  options: { rounds: { type: 'string' }, seconds: { type: 'string' }, conns: { type: 'string' } },
})
const rounds = Number(values.rounds ?? 8)
const seconds = Number(values.seconds ?? 3)
const conns = Number(values.conns ?? 32)
const ADMIN = 'bench-admin-token-0123456789abcdef'
const REPLY = JSON.stringify({
  id: 'chatcmpl-sim-1',
  object: 'chat.completion',
  created: 1764000000,
  model: 'chat-small',
  choices: [
    { index: 0, message: { role: 'assistant', content: 'Routers queue requests.' }, finish_reason: 'length' },
  ],
  usage: { prompt_tokens: 16, completion_tokens: 16, total_tokens: 32 },
})
const BODY = JSON.stringify({
  model: 'bench/fast',
  messages: [{ role: 'user', content: 'Say something short about routers and queues.' }],
  max_tokens: 16,
})

const TICK_US = 10_000
/** CPU time (us) per thread name of a process. */
function threads(pid: number): Map<string, number> {
  const out = new Map<string, number>()
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${t}/stat`, 'utf8')
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      const name = Number(t) === pid ? 'loop' : readFileSync(`/proc/${pid}/task/${t}/comm`, 'utf8').trim()
      out.set(name, (out.get(name) ?? 0) + (Number(f[11]) + Number(f[12])) * TICK_US)
    } catch {
      // a thread that ended
    }
  }
  return out
}

const free = () => {
  const s = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response() })
  const p = s.port!
  s.stop(true)
  return p
}
const dir = mkdtempSync(join(tmpdir(), 'tropa-receipts-bench-'))
const stubPort = free()
const stubFile = join(dir, 'stub.ts')
writeFileSync(
  stubFile,
  `Bun.serve({ port: ${stubPort}, hostname: '127.0.0.1', fetch: (r) => new URL(r.url).pathname.endsWith('/chat/completions') ? new Response(${JSON.stringify(REPLY)}, { headers: { 'content-type': 'application/json' } }) : new Response('{"data":[]}') })`,
)
const stub = Bun.spawn([process.execPath, stubFile], { stdout: 'ignore', stderr: 'inherit' })

async function router(receipts: boolean) {
  const sub = join(dir, receipts ? 'on' : 'off')
  const port = free()
  const cfg = join(dir, `${receipts ? 'on' : 'off'}.json`)
  writeFileSync(
    cfg,
    JSON.stringify({
      server: { host: '127.0.0.1', port, data_dir: sub, log_level: 'error', admin_token: ADMIN },
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
    }),
  )
  const proc = Bun.spawn(
    [
      process.execPath,
      '--max-http-header-size=65536',
      join(import.meta.dir, '../src/main.ts'),
      '--config',
      cfg,
    ],
    {
      stdout: 'ignore',
      stderr: 'inherit',
      env: {
        PATH: process.env.PATH ?? '',
        TROPA_WORKERS: '1',
        TROPA_RECEIPTS_RESPONSES: receipts ? '1' : '0',
      },
    },
  )
  const url = `http://127.0.0.1:${port}`
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${url}/ready`)).ok) break
    } catch {}
    if (i > 1000) throw new Error('router did not start')
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
  return { receipts, proc, url, key }
}

type Router = Awaited<ReturnType<typeof router>>
async function load(r: Router, ms: number): Promise<number> {
  const until = performance.now() + ms
  let n = 0
  const headers = { authorization: `Bearer ${r.key}`, 'content-type': 'application/json' }
  await Promise.all(
    Array.from({ length: conns }, async () => {
      while (performance.now() < until) {
        const res = await fetch(`${r.url}/v1/chat/completions`, { method: 'POST', headers, body: BODY })
        if (res.status !== 200) throw new Error(`${res.status} ${await res.text()}`)
        if (r.receipts && !res.headers.get('x-tropa-receipt')) throw new Error('no receipt')
        await res.arrayBuffer()
        n++
      }
    }),
  )
  return n
}

const on = await router(true)
const off = await router(false)
await load(on, 1000)
await load(off, 1000)
const per: Record<'on' | 'off', { loop: number[]; signer: number[] }> = {
  on: { loop: [], signer: [] },
  off: { loop: [], signer: [] },
}
const ratios: number[] = []
for (let i = 0; i < rounds; i++) {
  const order = i % 2 === 0 ? [on, off] : [off, on]
  const got: Record<string, number> = {}
  for (const r of order) {
    const a = threads(r.proc.pid)
    const n = await load(r, seconds * 1000)
    const b = threads(r.proc.pid)
    const side = r.receipts ? 'on' : 'off'
    const loop = (b.get('loop')! - a.get('loop')!) / n
    // Worker threads are named after nothing in particular: every thread but the loop, the ledger's and Bun's pools.
    let other = 0
    for (const [name, us] of b) if (name !== 'loop') other += us - (a.get(name) ?? 0)
    per[side].loop.push(loop)
    per[side].signer.push(other / n)
    got[side] = loop
  }
  ratios.push(got.on! / got.off! - 1)
  console.log(`round ${i + 1}: event loop ${got.on!.toFixed(1)} us (on) / ${got.off!.toFixed(1)} us (off)`)
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!
const mean = ratios.reduce((a, b) => a + b, 0) / ratios.length
const se = Math.sqrt(
  ratios.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, ratios.length - 1) / ratios.length,
)
console.log(
  `event-loop CPU per request: receipts on ${median(per.on.loop).toFixed(1)} us, off ${median(per.off.loop).toFixed(1)} us (medians of ${rounds} rounds of ${seconds} s, ${conns} connections)`,
)
console.log(
  `on / off - 1: ${(mean * 100).toFixed(1)}% ± ${(se * 100).toFixed(1)}% (mean of the rounds' ratios ± se), median ${(median(ratios) * 100).toFixed(1)}%`,
)
console.log(
  `other threads' CPU per request (ledger, receipts, Bun's pools): on ${median(per.on.signer).toFixed(1)} us, off ${median(per.off.signer).toFixed(1)} us`,
)
on.proc.kill()
off.proc.kill()
stub.kill()
process.exit(0)
