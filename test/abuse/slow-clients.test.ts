import { Database } from 'bun:sqlite'
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import net from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { type SimNode, startSimNode } from '../../src/simulator/index.ts'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { startSimProcess } from '../helpers/sim-process.ts'
import { ADMIN_TOKEN, CHAT_PRICE } from '../helpers/start.ts'

// Slow and abusive clients against a real Tropa process (so its memory can be read from /proc),
// in front of simulated nodes in another process that stream as long an answer as asked for,
// fast (~10,000 tokens a second each). During each attack another organization's /health and
// small chat completions keep a p99 under 100 ms and the router stays under 500 MB; after it, a
// stream whose client stopped reading was cut, its upstream aborted, and its bill covers what was
// relayed to the connection rather than the 100,000 tokens asked for. Before backpressure the
// first attack took the router to ~880 MB and its other tenant's p99 past a second.

const STALL_MS = 2000
const LONG = 100_000
const P99_MS = 100
const RSS_MB = 500

const dir = mkdtempSync(join(tmpdir(), 'tropa-abuse-'))
let fleet: Awaited<ReturnType<typeof startSimProcess>>
let quiet: SimNode
let router: Awaited<ReturnType<typeof startRouterProcess>>
let stderr: Promise<string>
let victimKey: string
let attackerMaster: string

beforeAll(async () => {
  fleet = await startSimProcess(
    [1, 2].map((i) => ({
      name: `fast-${i}`,
      seed: i,
      ignoreEos: true,
      // ~10,000 tokens a second per stream: 100,000 in 10 s, if nothing stops it
      itlMs: 0.1,
      iterationOverheadMs: 0,
      decodeMsPerSeq: 0,
      prefillTokensPerSec: 10_000_000,
    })),
  )
  // The other tenant's model is served by a node of its own: what is measured is the router, not
  // a simulator busy generating the attackers' tokens.
  quiet = await startSimNode({ name: 'quiet', timeScale: 0, seed: 9 })
  const configPath = join(dir, 'tropa.json')
  writeFileSync(
    configPath,
    JSON.stringify({
      server: {
        data_dir: dir,
        admin_token: ADMIN_TOKEN,
        log_level: 'error',
        stream_write_timeout_ms: STALL_MS,
      },
      storage: { flush_interval_ms: 10 },
      models: [
        {
          id: 'test/small',
          context_length: 4096,
          pricing: CHAT_PRICE,
          routes: [{ name: 'quiet', base_url: quiet.url, upstream_model: 'chat-up' }],
        },
        {
          id: 'test/long',
          context_length: 200_000,
          pricing: CHAT_PRICE,
          routes: fleet.nodes.map((n) => ({
            name: n.name,
            base_url: n.url,
            upstream_model: 'chat-up',
            max_concurrency: 1000,
          })),
        },
      ],
    }),
  )
  router = await startRouterProcess(configPath, freePort())
  stderr = new Response(router.proc.stderr).text()
  const victim = await jsonCall(router.url, '/v1/admin/organizations', ADMIN_TOKEN, {
    name: 'victim',
    balance_rub: 1000,
  })
  victimKey = (await jsonCall(router.url, '/v1/keys', victim.master_key as string, { name: 'v' }))
    .key as string
  const attacker = await jsonCall(router.url, '/v1/admin/organizations', ADMIN_TOKEN, {
    name: 'attacker',
    balance_rub: 1000,
  })
  attackerMaster = attacker.master_key as string
})

afterAll(async () => {
  router?.proc.kill('SIGKILL')
  await router?.proc.exited
  await fleet?.stop()
  await quiet?.stop()
  rmSync(dir, { recursive: true, force: true })
}, 20_000)

const port = () => Number(new URL(router.url).port)

const attackerKey = async (name: string) => {
  const k = await jsonCall(router.url, '/v1/keys', attackerMaster, { name })
  return { key: k.key as string, id: k.key_id as string }
}

/** The raw HTTP/1.1 request of a streamed chat completion asking for `LONG` tokens. */
const streamRequest = (key: string, i: number) => {
  const body = JSON.stringify({
    model: 'test/long',
    messages: [{ role: 'user', content: `tell me everything ${i}` }],
    stream: true,
    max_tokens: LONG,
  })
  return (
    `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  )
}

interface RawClient {
  socket: net.Socket
  received: number
  /** Content events received (one simulated token each). */
  tokens: number
  done: boolean
  closed: boolean
}

/** A client that sends its request and then reads nothing (until resumed). */
function silentClient(port: number, request: string): RawClient {
  const c: RawClient = {
    socket: net.connect(port, '127.0.0.1'),
    received: 0,
    tokens: 0,
    done: false,
    closed: false,
  }
  c.socket.pause()
  c.socket.on('connect', () => {
    c.socket.write(request)
    c.socket.pause()
  })
  c.socket.on('data', (d: Buffer) => {
    c.received += d.length
    // (an event split across two reads is missed: this undercounts by a few)
    c.tokens += tokensIn(d.toString('latin1'))
    if (d.includes('[DONE]')) c.done = true
  })
  c.socket.on('close', () => {
    c.closed = true
  })
  c.socket.on('error', () => {})
  return c
}

/** Reads what the client has left, until the server closes it (or `ms` pass). */
async function drain(c: RawClient, ms: number) {
  c.socket.resume()
  const until = Date.now() + ms
  while (!c.closed && Date.now() < until) await Bun.sleep(20)
}

/**
 * The others' p99 must stay under P99_MS, or, where this machine cannot give even well-behaved
 * clients that much (the same load saturates its two cores), under twice what they got while
 * the same load came from well-behaved clients, measured in the same run: the attack may not
 * cost the others more than honest traffic of its size does. A p99 of a few hundred samples on
 * two shared cores moves by half between identical runs (1.5x failed CI on code that passes it
 * nine times in ten); the defect this guards against put the others' p99 past a second.
 */
function expectOthersUnaffected(seen: Watched, control: Watched) {
  console.log('  others p99 (health, chat):', [seen.healthP99, seen.chatP99], 'control:', [
    control.healthP99,
    control.chatP99,
  ])
  // Both probes wait on the same event loop, and a p99 of a few hundred samples is noisy: the
  // allowance is the worse of the two under honest load.
  // Under 50 samples the "p99" is the slowest of a handful (14 in one CI run, at 1.16x the 2x
  // allowance): three times. The defect this guards against is past a second either way.
  const factor = Math.min(seen.samples, control.samples) < 50 ? 3 : 2
  const allowed = Math.max(P99_MS, factor * Math.max(control.healthP99, control.chatP99))
  expect(seen.healthP99).toBeLessThan(allowed)
  expect(seen.chatP99).toBeLessThan(allowed)
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return m ? Number(m[1]) / 1024 : 0
}

const p99 = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.ceil(s.length * 0.99) - 1)]!
}

/**
 * Another tenant's traffic and the router's memory while `ms` pass: GET /health and a small chat
 * completion one after the other, timed; VmRSS sampled every 50 ms.
 */
type Watched = Awaited<ReturnType<typeof watch>>

async function watch(ms: number) {
  const health: number[] = []
  const chat: number[] = []
  let peak = rssMiB(router.proc.pid)
  const sampler = setInterval(() => {
    peak = Math.max(peak, rssMiB(router.proc.pid))
  }, 50)
  const until = Date.now() + ms
  try {
    while (Date.now() < until) {
      let t = performance.now()
      const h = await fetch(`${router.url}/health`)
      await h.arrayBuffer()
      health.push(performance.now() - t)
      expect(h.status).toBe(200)
      t = performance.now()
      const r = await fetch(`${router.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${victimKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'test/small',
          messages: [{ role: 'user', content: 'hi' }],
          max_tokens: 5,
        }),
      })
      const body = (await r.json()) as { usage?: { completion_tokens: number } }
      chat.push(performance.now() - t)
      expect(r.status).toBe(200)
      expect(body.usage?.completion_tokens).toBe(5)
      await Bun.sleep(10)
    }
  } finally {
    clearInterval(sampler)
  }
  peak = Math.max(peak, rssMiB(router.proc.pid))
  return { healthP99: p99(health), chatP99: p99(chat), samples: health.length, peakRssMiB: peak }
}

/** The ledger rows of one key, once `n` are there. */
async function ledgerRows(keyId: string, n: number) {
  type Row = { completion_tokens: number; outcome: string; estimated: number }
  let rows: Row[] = []
  for (let i = 0; i < 300; i++) {
    const db = new Database(join(dir, 'tropa.db'), { readonly: true })
    try {
      rows = db
        .query('SELECT completion_tokens, outcome, estimated FROM ledger WHERE key_id = ?')
        .all(keyId) as Row[]
    } finally {
      db.close()
    }
    if (rows.length >= n) break
    await Bun.sleep(20)
  }
  return rows
}

const fleetStats = () => fleet.stats()

/** Content events in relayed SSE text, the empty first one aside: one simulated token each. */
const tokensIn = (text: string) => text.match(/"content":"[^"]/g)?.length ?? 0

/**
 * The control for a stream attack: the others watched for `ms` while `n` clients make the same
 * streamed requests and read them as fast as they come; their upstream requests have ended
 * (aborted when they are dropped) before this returns, so the attack's counts start clean.
 */
async function honestStreams(name: string, n: number, ms: number): Promise<Watched> {
  const { key } = await attackerKey(name)
  const readers = Array.from({ length: n }, (_, i) => silentClient(port(), streamRequest(key, 1000 + i)))
  for (const r of readers) r.socket.on('connect', () => r.socket.resume())
  const control = await watch(ms)
  for (const r of readers) r.socket.destroy()
  for (let last = -1, i = 0; i < 30; i++) {
    const { aborted } = await fleetStats()
    if (aborted === last) break
    last = aborted
    await Bun.sleep(300)
  }
  return control
}

test('streams whose clients never read: cut after the stall timeout, upstream aborted, billed what was sent; others unaffected', async () => {
  const n = 20
  const control = await honestStreams('stall-control', n, STALL_MS + 3000)
  const { key, id } = await attackerKey('stall')
  const before = await fleetStats()
  const clients = Array.from({ length: n }, (_, i) => silentClient(port(), streamRequest(key, i)))
  for (let i = 0; i < 200 && (await fleetStats()).streams - before.streams < n; i++) await Bun.sleep(10)
  expect((await fleetStats()).streams - before.streams).toBe(n)

  const seen = await watch(STALL_MS + 3000)
  console.log('never-reading streams:', seen)
  expect(seen.peakRssMiB).toBeLessThan(RSS_MB)
  expectOthersUnaffected(seen, control)

  const rows = await ledgerRows(id, n)
  expect(rows.length).toBe(n)
  // Every upstream request was aborted, not generated to its end.
  expect((await fleetStats()).aborted - before.aborted).toBe(n)
  for (const r of rows) {
    expect(r.outcome).toBe('client_stalled')
    // What the sockets' buffers could hold, not the 100,000 tokens generated without backpressure.
    expect(r.completion_tokens).toBeLessThan(LONG / 2)
    expect(r.completion_tokens).toBeGreaterThan(0)
  }
  await Promise.all(clients.map((c) => drain(c, 5000)))
  for (const c of clients) {
    // The connection was closed under the client, which never saw the end of the answer.
    expect(c.closed).toBe(true)
    expect(c.done).toBe(false)
  }
  const billed = rows.reduce((s, r) => s + r.completion_tokens, 0)
  const delivered = clients.reduce((s, c) => s + c.tokens, 0)
  console.log('never-reading streams: billed', billed, 'tokens, delivered', delivered)
  // Nobody pays for less than they were sent.
  expect(billed).toBeGreaterThanOrEqual(delivered)
}, 30_000)

// A JS client cannot shrink its receive buffer to read a byte a second; this one takes one read a
// second (whatever one read returns), far slower than the stream comes.
test('streams read a trickle (one read a second): memory stays bounded, others unaffected, billed what was sent', async () => {
  const n = 10
  const control = await honestStreams('trickle-control', n, 4000)
  const { key, id } = await attackerKey('trickle')
  const before = await fleetStats()
  const clients = Array.from({ length: n }, (_, i) => silentClient(port(), streamRequest(key, i)))
  // One read a second: resume, and pause again on the next chunk.
  for (const c of clients) c.socket.on('data', () => c.socket.pause())
  const trickle = setInterval(() => {
    for (const c of clients) if (!c.closed) c.socket.resume()
  }, 1000)
  try {
    for (let i = 0; i < 200 && (await fleetStats()).streams - before.streams < n; i++) await Bun.sleep(10)
    const seen = await watch(4000)
    console.log('trickle readers:', seen)
    expect(seen.peakRssMiB).toBeLessThan(RSS_MB)
    expectOthersUnaffected(seen, control)
  } finally {
    clearInterval(trickle)
  }
  for (const c of clients) c.socket.destroy()
  const rows = await ledgerRows(id, n)
  expect(rows.length).toBe(n)
  for (let i = 0; i < 100 && (await fleetStats()).aborted - before.aborted < n; i++) await Bun.sleep(20)
  expect((await fleetStats()).aborted - before.aborted).toBe(n)
  const billed = rows.reduce((s, r) => s + r.completion_tokens, 0)
  const delivered = clients.reduce((s, c) => s + c.tokens, 0)
  console.log(
    'trickle readers: billed',
    billed,
    'tokens, delivered',
    delivered,
    rows.map((r) => r.outcome),
  )
  for (const r of rows) {
    // Cut as stalled (its socket did not drain within the timeout) or gone when it hung up.
    expect(['client_stalled', 'client_disconnected']).toContain(r.outcome)
    expect(r.completion_tokens).toBeLessThan(LONG / 2)
  }
  expect(billed).toBeGreaterThanOrEqual(delivered)
}, 30_000)

test('2,000 idle keep-alive connections: others unaffected, memory bounded', async () => {
  const n = 2000
  let answered = 0
  const sockets: Awaited<ReturnType<typeof Bun.connect>>[] = []
  for (let i = 0; i < n; i += 100) {
    const batch = await Promise.all(
      Array.from({ length: Math.min(100, n - i) }, () =>
        Bun.connect({
          hostname: '127.0.0.1',
          port: port(),
          socket: {
            data(_s, d) {
              if (d.toString('latin1').startsWith('HTTP/1.1 200')) answered++
            },
            error() {},
          },
        }),
      ),
    )
    for (const s of batch) s.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n')
    sockets.push(...batch)
  }
  for (let i = 0; i < 300 && answered < n; i++) await Bun.sleep(10)
  // Each connection was served and is now an idle keep-alive connection.
  expect(answered).toBe(n)
  const seen = await watch(3000)
  console.log('idle connections:', seen)
  expect(seen.peakRssMiB).toBeLessThan(RSS_MB)
  expect(seen.healthP99).toBeLessThan(P99_MS)
  expect(seen.chatP99).toBeLessThan(P99_MS)
  for (const s of sockets) s.end()
}, 30_000)

test('downloads of a big file by clients that never read: read from disk as they go, not buffered', async () => {
  const line = `{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"pad":"${'a'.repeat(2000)}"}}\n`
  const form = new FormData()
  form.append('purpose', 'batch')
  form.append('file', new Blob([line.repeat(16_000)]), 'big.jsonl') // 33 MB
  const { key } = await attackerKey('files')
  const up = await fetch(`${router.url}/v1/files`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}` },
    body: form,
  })
  expect(up.status).toBe(200)
  const file = (await up.json()) as { id: string; bytes: number }
  const n = 10
  const before = rssMiB(router.proc.pid)
  const clients = Array.from({ length: n }, () =>
    silentClient(
      port(),
      `GET /v1/files/${file.id}/content HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n\r\n`,
    ),
  )
  const seen = await watch(2000)
  console.log('never-read downloads:', seen, 'RSS before', before)
  // Buffered whole, ten downloads of 33 MB would add 330 MB.
  expect(seen.peakRssMiB - before).toBeLessThan(100)
  expect(seen.healthP99).toBeLessThan(P99_MS)
  expect(seen.chatP99).toBeLessThan(P99_MS)
  for (const c of clients) c.socket.destroy()
}, 30_000)

test('uploads abandoned mid-body, over and over: nothing left on disk, others unaffected', async () => {
  const { key } = await attackerKey('uploads')
  const boundary = 'abuse-boundary'
  const head =
    `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n` +
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n` +
    'Content-Type: application/jsonl\r\n\r\n'
  const chunk = Buffer.from(`${'{"custom_id":"x"}'.padEnd(1023, ' ')}\n`.repeat(1024)) // 1 MiB
  let sent = 0
  const attack = async (i: number) => {
    // Declares 150 MiB, sends 1-8 MiB, then goes away without a word.
    const socket = net.connect(port(), '127.0.0.1')
    socket.on('error', () => {})
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()))
    socket.write(
      `POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n` +
        `Content-Type: multipart/form-data; boundary=${boundary}\r\nContent-Length: ${150 * 2 ** 20}\r\n\r\n${head}`,
    )
    for (let mb = 0; mb < 1 + (i % 8); mb++) {
      if (!socket.write(chunk)) await new Promise((resolve) => socket.once('drain', resolve))
      sent += chunk.length
    }
    socket.destroy()
  }
  const filesOf = async () =>
    (
      (await (
        await fetch(`${router.url}/v1/files`, { headers: { authorization: `Bearer ${key}` } })
      ).json()) as { data: { id: string }[] }
    ).data.map((f) => f.id)
  // The control: the same uploads from the same raw sockets, whole (each declares what it sends,
  // finishes the form and reads the answer), so the two differ only in being abandoned. A control
  // sent through fetch and FormData cost this process less CPU than the raw writes, and the
  // attack read 2x its p99 on that alone (130 against 56 ms in one CI run).
  const tail = `\r\n--${boundary}--\r\n`
  const whole = async (i: number) => {
    const mbs = 1 + (i % 8)
    const socket = net.connect(port(), '127.0.0.1')
    socket.on('error', () => {})
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()))
    let answer = ''
    const answered = new Promise<void>((resolve) => {
      socket.on('data', (d: Buffer) => {
        answer += d.toString('latin1')
        if (answer.includes('\r\n\r\n')) resolve()
      })
      socket.once('close', () => resolve())
    })
    const length = Buffer.byteLength(head) + mbs * chunk.length + Buffer.byteLength(tail)
    socket.write(
      `POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n` +
        `Content-Type: multipart/form-data; boundary=${boundary}\r\nContent-Length: ${length}\r\n\r\n${head}`,
    )
    for (let mb = 0; mb < mbs; mb++) {
      if (!socket.write(chunk)) await new Promise((resolve) => socket.once('drain', resolve))
    }
    socket.write(tail)
    await answered
    socket.destroy()
    expect(answer.slice(0, 12)).toBe('HTTP/1.1 200')
  }
  const honest = (async () => {
    for (let round = 0; round < 6; round++) await Promise.all(Array.from({ length: 8 }, (_, i) => whole(i)))
  })()
  const control = await watch(3000)
  await honest
  const filesBefore = await filesOf()
  const attacking = (async () => {
    for (let round = 0; round < 6; round++) await Promise.all(Array.from({ length: 8 }, (_, i) => attack(i)))
  })()
  const seen = await watch(3000)
  await attacking
  console.log('abandoned uploads:', seen, `${Math.round(sent / 2 ** 20)} MiB sent`)
  expect(sent).toBeGreaterThan(100 * 2 ** 20)
  expect(seen.peakRssMiB).toBeLessThan(RSS_MB)
  expectOthersUnaffected(seen, control)
  // Every partial upload is removed once its client is gone: no .part file, no row.
  const { readdirSync } = await import('node:fs')
  const partials = () => readdirSync(join(dir, 'files')).filter((f) => f.endsWith('.part'))
  for (let i = 0; i < 100 && partials().length > 0; i++) await Bun.sleep(20)
  expect(partials()).toEqual([])
  expect(await filesOf()).toEqual(filesBefore)
}, 60_000)

test('nothing went to stderr (no error printed by a cut stream)', async () => {
  router.proc.kill('SIGTERM')
  await router.proc.exited
  expect(await stderr).toBe('')
})
