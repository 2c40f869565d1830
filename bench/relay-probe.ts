#!/usr/bin/env bun
/**
 * Issue #24: resident memory per open stream of the ways Bun can relay a streamed fetch body to a
 * Bun.serve response while JavaScript sees every chunk, against the body returned as it is.
 *
 * BUN_CONFIG_MAX_HTTP_REQUESTS=65535 bun bench/relay-probe.ts [--modes a,b] [--streams 3000] [--rounds 3]
 * (the variable lets this process hold more than 256 fetches open at once)
 *
 * One stub upstream (its own process: an SSE event at once, then one a second), one proxy process
 * per mode and round (started afresh), this process the client. Per mode: resident set before,
 * N streams opened at 2,000/s, each waited for until its first event, held 2 s; (peak - before)/N.
 * Then backpressure: one client that never reads asks a fast upstream (64 KiB chunks, pulled on
 * demand) and after 3 s the bytes the upstream was asked for and the proxy's growth are read.
 */
import http from 'node:http'
import net from 'node:net'

/** The controller Bun gives a direct stream's pull(). */
interface Direct {
  write(bytes: Uint8Array): number | Promise<number>
  flush(): unknown
  close(): void
}

const MODES: Record<string, (body: ReadableStream<Uint8Array>, req: Request) => BodyInit> = {
  /** The body returned as it is: Bun pipes socket to socket. */
  bare: (body) => body,
  /** A direct stream, one pull for the body, a reader's read per chunk (Tropa and bare-proxy relay). */
  direct: (body) => directWith(body, {}),
  /** direct, the request kept for the stream's life (as a cut on stall needs it: server.timeout). */
  directKeepRequest: (body, req) => {
    const s = MODES.direct!(body, req) as ReadableStream & { req?: Request }
    s.req = req
    return s
  },
  /** directKeepRequest, the request's body read as text (Tropa's parse) rather than an ArrayBuffer. */
  directKeepRequestText: (body, req) => MODES.directKeepRequest!(body, req),
  /** direct, the upstream fetched with decompress: true (Tropa's setting). */
  directDecompress: (body, req) => MODES.direct!(body, req),
  /** direct with a small highWaterMark on the source (the response sink's buffer). */
  directHwm64: (body) => directWith(body, { highWaterMark: 64 }),
  directHwm1k: (body) => directWith(body, { highWaterMark: 1024 }),
  directHwm64k: (body) => directWith(body, { highWaterMark: 65536 }),
  /** The upstream body kept unread; a direct stream writes one event and waits (the serve side alone). */
  unreadDirect: (body) => staticDirect(body, false),
  /** The upstream body read in JS (discarded, a read always pending); a direct stream writes one event. */
  readDirect: (body) => staticDirect(body, true),
  /** The upstream body kept unread; a pull stream with one event then nothing. */
  unreadPull: (body) => {
    let sent = false
    return new ReadableStream<Uint8Array>(
      {
        pull(c) {
          if (!sent) {
            sent = true
            c.enqueue(EVENT)
          }
          return new Promise(() => {})
        },
        cancel: () => void body.cancel().catch(() => {}),
      },
      { highWaterMark: 0 },
    )
  },
  /** A direct stream with `for await` over the body. */
  directForAwait: (body) =>
    new ReadableStream({
      type: 'direct',
      async pull(controller: Direct) {
        try {
          for await (const value of body) {
            const w = controller.write(value)
            controller.flush()
            if (w instanceof Promise) await w
          }
          controller.close()
        } catch {
          controller.close()
        }
      },
    } as unknown as UnderlyingDefaultSource<Uint8Array>),
  /** A default stream, one read per pull, enqueue (highWaterMark 0: no read ahead). */
  pull: (body) => {
    const reader = body.getReader()
    return new ReadableStream<Uint8Array>(
      {
        async pull(controller) {
          const { done, value } = await reader.read()
          if (done) controller.close()
          else controller.enqueue(value)
        },
        cancel: () => void reader.cancel().catch(() => {}),
      },
      { highWaterMark: 0 },
    )
  },
  /** A byte stream, one read per pull. */
  bytes: (body) => {
    const reader = body.getReader()
    return new ReadableStream(
      {
        type: 'bytes',
        async pull(controller) {
          const { done, value } = await reader.read()
          if (done) controller.close()
          else controller.enqueue(value as Uint8Array<ArrayBuffer>)
        },
        cancel: () => void reader.cancel().catch(() => {}),
      },
      { highWaterMark: 0 },
    )
  },
  /** An async generator as the body (Bun turns it into a direct stream). */
  generator: (body) =>
    (async function* () {
      for await (const value of body) yield value
    })() as unknown as BodyInit,
  /** An async generator with a reader rather than for await. */
  generatorReader: (body) => {
    const reader = body.getReader()
    return (async function* () {
      try {
        for (;;) {
          const { done, value } = await reader.read()
          if (done) return
          yield value
        }
      } finally {
        reader.cancel().catch(() => {})
      }
    })() as unknown as BodyInit
  },
  /** pipeThrough a TransformStream that looks at each chunk. */
  transform: (body) =>
    body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          controller.enqueue(chunk)
        },
      }),
    ),
  /** tee: one branch returned (piped), the other read in JavaScript. */
  tee: (body) => {
    const [a, b] = body.tee()
    void (async () => {
      for await (const _ of b) {
      }
    })().catch(() => {})
    return a
  },
}

function directWith(
  body: ReadableStream<Uint8Array>,
  extra: Record<string, unknown>,
): ReadableStream<Uint8Array> {
  const reader = body.getReader()
  return new ReadableStream({
    type: 'direct',
    ...extra,
    async pull(controller: Direct) {
      try {
        for (;;) {
          const { done, value } = await reader.read()
          if (done) return void controller.close()
          const w = controller.write(value)
          controller.flush()
          if (w instanceof Promise) await w
        }
      } catch {
        controller.close()
      }
    },
    cancel: () => void reader.cancel().catch(() => {}),
  } as unknown as UnderlyingDefaultSource<Uint8Array>)
}

function staticDirect(body: ReadableStream<Uint8Array>, read: boolean): ReadableStream<Uint8Array> {
  const reader = body.getReader()
  if (read)
    void (async () => {
      for (;;) if ((await reader.read()).done) return
    })().catch(() => {})
  return new ReadableStream({
    type: 'direct',
    async pull(controller: Direct) {
      controller.write(EVENT)
      controller.flush()
      await new Promise(() => {})
    },
    cancel: () => void reader.cancel().catch(() => {}),
  } as unknown as UnderlyingDefaultSource<Uint8Array>)
}

MODES.rawNet = MODES.bare!
/** The upstream read with node:http's client (a keep-alive agent), relayed as rawNet is. */
MODES.nodeHttp = MODES.bare!
/** The upstream read from a Bun.connect socket (paused on backpressure): what upstream/h1.ts does. */
MODES.rawBun = MODES.bare!

const EVENT = new TextEncoder().encode(
  `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'tok ' } }] })}\n\n`,
)
const BIG = new Uint8Array(64 * 1024).fill(97)

function upstream(portFile: string): void {
  let pulled = 0
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    fetch(req) {
      const url = new URL(req.url)
      if (url.pathname === '/pulled') return new Response(String(pulled))
      if (url.pathname === '/fast') {
        return new Response(
          new ReadableStream<Uint8Array>(
            {
              pull(c) {
                pulled += BIG.length
                c.enqueue(BIG)
              },
            },
            { highWaterMark: 0 },
          ),
          { headers: { 'content-type': 'text/event-stream' } },
        )
      }
      let timer: Timer | undefined
      let n = 0
      return new Response(
        new ReadableStream<Uint8Array>({
          start(c) {
            c.enqueue(EVENT)
            timer = setInterval(() => {
              try {
                c.enqueue(EVENT)
                if (++n >= 64) {
                  clearInterval(timer)
                  c.close()
                }
              } catch {
                clearInterval(timer)
              }
            }, 1000)
          },
          cancel: () => clearInterval(timer),
        }),
        { headers: { 'content-type': 'text/event-stream' } },
      )
    },
  })
  Bun.write(portFile, String(server.port))
}

function proxy(mode: string, upstreamPort: string, portFile: string): void {
  const wrap = MODES[mode]
  if (!wrap) throw new Error(`unknown mode ${mode}`)
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    async fetch(req) {
      const path = new URL(req.url).pathname
      if (mode === 'nodeHttp') return nodeHttpRelay(Number(upstreamPort), path, await req.arrayBuffer())
      if (mode === 'rawNet' || mode === 'rawBun')
        return rawRelay(mode, Number(upstreamPort), path, await req.arrayBuffer())
      const res = await fetch(`http://127.0.0.1:${upstreamPort}${path}`, {
        method: 'POST',
        body: mode === 'directKeepRequestText' ? await req.text() : await req.arrayBuffer(),
        signal: req.signal,
        decompress: mode === 'directDecompress',
      })
      return new Response(res.body ? wrap(res.body, req) : null, { status: res.status, headers: res.headers })
    },
  })
  Bun.write(portFile, String(server.port))
}

const agent = new http.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY })

/** The upstream read with node:http's client, its data events written to a direct stream, paused on backpressure. */
/** Writes a chunk to the client's direct stream; while the client is full, the source is paused. */
function writeOrPause(c: Direct, chunk: Uint8Array, pause: () => void, resume: () => void): void {
  const w = c.write(chunk)
  c.flush()
  if (w instanceof Promise) {
    pause()
    w.then(resume, () => {})
  }
}

function nodeHttpRelay(port: number, path: string, body: ArrayBuffer): Promise<Response> {
  return new Promise((resolve, reject) => {
    const headers = { 'content-type': 'application/json', 'content-length': body.byteLength }
    const out = http.request({ host: '127.0.0.1', port, path, method: 'POST', agent, headers }, (src) => {
      const source = {
        type: 'direct',
        pull: (c: Direct) =>
          new Promise<void>((done) => {
            src.on('data', (d: Buffer) =>
              writeOrPause(
                c,
                d,
                () => src.pause(),
                () => src.resume(),
              ),
            )
            const end = () => {
              c.close()
              done()
            }
            src.on('end', end)
            src.on('error', end)
          }),
        cancel: () => src.destroy(),
      }
      resolve(
        new Response(new ReadableStream(source as unknown as UnderlyingDefaultSource<Uint8Array>), {
          status: src.statusCode,
          headers: { 'content-type': 'text/event-stream' },
        }),
      )
    })
    out.on('error', reject)
    out.end(Buffer.from(body))
  })
}

/**
 * The upstream read from a socket of its own (no fetch): the request written by hand, the answer's
 * head skipped, its (chunked) bytes relayed as they come. A probe of what fetch's body costs, not
 * an HTTP client: the chunk-size lines go to the client too.
 */
function rawRelay(mode: string, port: number, path: string, body: ArrayBuffer): Response {
  const head = `POST ${path} HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\ncontent-length: ${body.byteLength}\r\n\r\n`
  let controller: Direct | undefined
  let inHead = true
  let closeUp: () => void = () => {}
  const onData = (buf: Uint8Array, pause: () => void, resume: () => void) => {
    let b = buf
    if (inHead) {
      const at = Buffer.from(b).indexOf('\r\n\r\n')
      if (at < 0) return
      inHead = false
      b = b.subarray(at + 4)
      if (b.length === 0) return
    }
    if (controller) writeOrPause(controller, b, pause, resume)
  }
  if (mode === 'rawNet') {
    const sock = net.connect(port, '127.0.0.1')
    sock.write(head)
    sock.write(Buffer.from(body))
    sock.on('data', (d: Buffer) =>
      onData(
        d,
        () => sock.pause(),
        () => sock.resume(),
      ),
    )
    sock.on('close', () => controller?.close())
    sock.on('error', () => {})
    closeUp = () => sock.destroy()
  } else {
    void Bun.connect({
      hostname: '127.0.0.1',
      port,
      socket: {
        open(s) {
          s.write(head)
          s.write(new Uint8Array(body))
          closeUp = () => s.end()
        },
        data(s, d) {
          onData(
            d,
            () => s.pause(),
            () => s.resume(),
          )
        },
        close() {
          controller?.close()
        },
        error() {},
      },
    })
  }
  return new Response(
    new ReadableStream({
      type: 'direct',
      pull(c: Direct) {
        controller = c
        return new Promise(() => {})
      },
      cancel: () => closeUp(),
    } as unknown as UnderlyingDefaultSource<Uint8Array>),
    { headers: { 'content-type': 'text/event-stream' } },
  )
}

const rss = (pid: number): number => {
  const t = require('node:fs').readFileSync(`/proc/${pid}/status`, 'utf8') as string
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(t)?.[1] ?? 0)
}

async function start(args: string[]): Promise<{ proc: Bun.Subprocess; port: number }> {
  const portFile = `/tmp/relay-probe-${process.pid}-${Math.random().toString(36).slice(2)}`
  const proc = Bun.spawn([process.execPath, import.meta.path, ...args, portFile], {
    stdio: ['ignore', 'inherit', 'inherit'],
    env: { ...process.env, BUN_CONFIG_MAX_HTTP_REQUESTS: '65535' },
  })
  for (;;) {
    await Bun.sleep(20)
    const f = Bun.file(portFile)
    if ((await f.exists()) && (await f.text()).length) {
      const port = Number(await f.text())
      require('node:fs').rmSync(portFile)
      return { proc, port }
    }
  }
}

async function measure(mode: string, upPort: number, n: number): Promise<Record<string, number>> {
  const { proc, port } = await start(['proxy', mode, String(upPort)])
  const url = `http://127.0.0.1:${port}/stream`
  // Warm up: a few whole streams' openings.
  for (let i = 0; i < 20; i++) {
    const ab = new AbortController()
    const r = await fetch(url, { method: 'POST', body: '{}', signal: ab.signal })
    const rd = r.body!.getReader()
    await rd.read()
    ab.abort()
    await rd.cancel().catch(() => {})
  }
  await Bun.sleep(500)
  Bun.gc(true)
  const before = rss(proc.pid!)
  let peak = before
  const sampler = setInterval(() => {
    const x = rss(proc.pid!)
    if (x > peak) peak = x
  }, 50)
  const abort = new AbortController()
  let opened = 0
  let failed = 0
  let resolveAll!: () => void
  const all = new Promise<void>((r) => {
    resolveAll = r
  })
  const one = async () => {
    try {
      const r = await fetch(url, { method: 'POST', body: '{}', signal: abort.signal })
      const rd = r.body!.getReader()
      let first = true
      for (;;) {
        const { done } = await rd.read()
        if (done) break
        if (first) {
          first = false
          if (++opened + failed >= n) resolveAll()
        }
      }
    } catch {
      if (!abort.signal.aborted && ++failed + opened >= n) resolveAll()
    }
  }
  const t0 = performance.now()
  const batch = 40
  for (let i = 0; i < n; i += batch) {
    for (let k = i; k < Math.min(n, i + batch); k++) void one()
    await Bun.sleep(20)
  }
  await Promise.race([all, Bun.sleep(20_000)])
  const openMs = performance.now() - t0
  await Bun.sleep(2000)
  clearInterval(sampler)
  const held = rss(proc.pid!)
  abort.abort()
  await Bun.sleep(1500)

  // Backpressure: a client that never reads.
  const pulled0 = Number(await (await fetch(`http://127.0.0.1:${upPort}/pulled`)).text())
  const rss0 = rss(proc.pid!)
  const sock = net.connect(port, '127.0.0.1')
  await new Promise<void>((r) => sock.once('connect', () => r()))
  sock.write('POST /fast HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}')
  sock.once('data', () => sock.pause())
  await Bun.sleep(3000)
  const pulledMiB =
    (Number(await (await fetch(`http://127.0.0.1:${upPort}/pulled`)).text()) - pulled0) / 2 ** 20
  const growMiB = (rss(proc.pid!) - rss0) / 1024
  sock.destroy()
  proc.kill()
  await proc.exited
  return {
    opened,
    failed,
    openMs: Math.round(openMs),
    beforeMiB: before / 1024,
    perStreamKiB: opened ? (peak - before) / opened : Number.NaN,
    heldPerStreamKiB: opened ? (held - before) / opened : Number.NaN,
    bpPulledMiB: pulledMiB,
    bpGrowMiB: growMiB,
  }
}

async function run(): Promise<void> {
  const arg = (name: string, dflt: string) => {
    const i = process.argv.indexOf(`--${name}`)
    return i > 0 ? process.argv[i + 1]! : dflt
  }
  const modes = arg('modes', Object.keys(MODES).join(',')).split(',')
  const n = Number(arg('streams', '3000'))
  const rounds = Number(arg('rounds', '3'))
  const up = await start(['upstream'])
  const results: Record<string, Record<string, number>[]> = {}
  try {
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 ? [...modes].reverse() : modes
      for (const m of order) {
        const x = await measure(m, up.port, n)
        const list = results[m] ?? []
        results[m] = list
        list.push(x)
        console.log(
          `round ${r + 1} ${m}: ${JSON.stringify(x, (_, v) => (typeof v === 'number' ? Math.round(v * 10) / 10 : v))}`,
        )
      }
    }
  } finally {
    up.proc.kill()
  }
  const med = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b)
    return s[Math.floor(s.length / 2)]!
  }
  console.log(
    `\n| mode (${n} streams, median of ${rounds}) | per open stream, KiB (peak) | held, KiB | ratio to bare | backpressure: upstream pulled in 3 s, MiB | proxy growth, MiB |`,
  )
  console.log('| --- | --- | --- | --- | --- | --- |')
  const bare = results.bare ? med(results.bare.map((x) => x.perStreamKiB!)) : Number.NaN
  for (const m of modes) {
    const xs = results[m]!
    const per = med(xs.map((x) => x.perStreamKiB!))
    console.log(
      `| ${m} | ${per.toFixed(1)} (${xs.map((x) => x.perStreamKiB!.toFixed(1)).join(', ')}) | ${med(xs.map((x) => x.heldPerStreamKiB!)).toFixed(1)} | ${(per / bare).toFixed(2)}x | ${med(xs.map((x) => x.bpPulledMiB!)).toFixed(1)} | ${med(xs.map((x) => x.bpGrowMiB!)).toFixed(1)} |`,
    )
  }
}

const [cmd, ...rest] = process.argv.slice(2)
if (cmd === 'upstream') upstream(rest[0]!)
else if (cmd === 'proxy') proxy(rest[0]!, rest[1]!, rest[2]!)
else await run()
