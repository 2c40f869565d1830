// Tropa's own HTTP/1.1 client, for streamed upstream calls only (providers/http.ts chooses it).
//
// Why not fetch: reading a fetch body from JavaScript costs about 10 KiB per open stream in this
// Bun (its byte stream allocates a fresh chunk buffer per read, and no BYOB reader is allowed on
// it), and node:http's and undici's clients cost as much (the stream machinery between the socket
// and the reader). A Bun socket hands each read over as a fresh Buffer with nothing in between:
// bench/relay-probe.ts measured 8 KiB per stream against fetch's 25 and the bare pipe's 12.
//
// What it does: POST over a pooled keep-alive socket (TCP, or TLS with Bun's root CAs or a
// route's own CA), the response head parsed (1xx skipped), the body framed by chunked encoding,
// Content-Length or the connection's close, and handed to one reader as it arrives. Bounded: the
// head at 64 KiB, a chunk line at 1 KiB, trailers at 64 KiB; the socket is paused while more than
// 64 KiB waits unread, so a slow reader stops the upstream. gzip and deflate bodies are inflated
// through a web stream (Tropa asks for `identity`; an upstream that compresses anyway still works).
// A pooled socket the server closes as the request comes (within 100 ms, nothing answered: its
// idle timeout racing ours) is replaced once and the request sent anew; a later close is the
// answer, as with fetch. A pooled socket is not reused after 4 s idle, or the server's own
// `keep-alive: timeout` less a second. 307 and 308 are followed within the origin (or to https on
// the same host); a configured Host and a URL's credentials are sent as fetch sends them. An abort
// rejects whatever is under way (the connect too) with its reason, and drops what waits unread.
// Not here: proxies (HTTP_PROXY and the like send every call through fetch), HTTP/2, other
// redirects, request bodies streamed from the client.

/** The reader of a response body: what the relay needs of a web stream's reader. */
export interface BodyReader {
  read(): Promise<ReadableStreamReadResult<Uint8Array>>
  cancel(reason?: unknown): Promise<void>
}

/** One request: a POST with a whole body. */
export interface H1Request {
  readonly url: URL
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
  readonly signal: AbortSignal
  /** PEM CA certificates to trust instead of the default roots (a route's `tls_ca_file`). */
  readonly ca?: string | undefined
}

const MAX_HEAD_BYTES = 64 * 1024
const MAX_LINE_BYTES = 1024
const MAX_TRAILER_BYTES = 64 * 1024
/** Above this many unread bytes the socket is paused; at or below LOW_WATER it reads on. */
const HIGH_WATER = 64 * 1024
const LOW_WATER = 16 * 1024
/** A pooled socket is not reused after this long unused (servers commonly close at 5 s). */
const IDLE_MS = 4_000
/**
 * Bun's socket timeouts tick every 4 s: a timeout of 8 s closes an idle socket 4 to 8 s after
 * its last use; take() skips one older than its keep time before that.
 */
const IDLE_TIMEOUT_SECONDS = 8
/** A close this soon after the request was sent, with nothing answered, is a stale socket's. */
const RACE_MS = 100
/** Redirects followed (307 and 308 within one origin, or to https on the same host). */
const MAX_REDIRECTS = 5
/** Pooled sockets kept per origin; more are closed as their exchanges end. */
const MAX_IDLE_PER_ORIGIN = 256

enum Phase {
  Idle = 0,
  Head = 1,
  ChunkSize = 2,
  ChunkData = 3,
  ChunkEnd = 4,
  Trailer = 5,
  Length = 6,
  UntilClose = 7,
  Done = 8,
}

/** A protocol error of the upstream's (a malformed head, chunk or length). */
export class UpstreamProtocolError extends Error {
  readonly code = 'EPROTO'
}

/** The connection closed before any byte of the answer came (a pooled socket: retried once). */
class ClosedBeforeAnswer extends Error {
  readonly code = 'ECONNRESET'
}

/** A 2xx or error answer whose body is still unread. */
export class H1Response {
  private webResponse: Response | undefined
  private taken = false

  constructor(
    readonly status: number,
    /** The head's field lines, as they came (parsed again only if the headers are asked for). */
    private head: string,
    private readonly raw: Body,
    private readonly encoding: string | undefined,
    /** The Location of a redirect. */
    readonly location: string | undefined,
  ) {}

  get ok(): boolean {
    return this.status >= 200 && this.status < 300
  }

  headers(): Headers {
    const h = new Headers()
    for (const line of this.head.split('\r\n')) {
      const colon = line.indexOf(':')
      try {
        if (colon > 0) h.append(line.slice(0, colon), line.slice(colon + 1).trim())
      } catch {
        // a field fetch's Headers refuses: left out
      }
    }
    return h
  }

  /** The body's one reader: the socket's chunks themselves unless the body is compressed. */
  reader(forResponse = false): BodyReader {
    if (this.taken) throw new TypeError('the body is already being read')
    this.taken = true
    // Read directly (the relay), the headers are not asked for again: not kept for the stream.
    if (!forResponse) this.head = ''
    if (this.encoding === undefined) return this.raw
    const inflate = new DecompressionStream(this.encoding as CompressionFormat)
    return webBody(this.raw)
      .pipeThrough(inflate as unknown as ReadableWritablePair<Uint8Array, Uint8Array>)
      .getReader()
  }

  /**
   * Aborts the exchange as the request's signal would: the body fails with `reason` and the
   * socket is let go. The reply's abort once its node has answered, so that the request's
   * AbortController need not be kept for the stream's life.
   */
  abort(reason: unknown): void {
    this.raw.abort(reason)
  }

  /** The answer as a web Response (made on first use), for readers that want one. */
  get response(): Response {
    if (this.webResponse) return this.webResponse
    const headers = this.headers()
    const none = this.status === 204 || this.status === 205 || this.status === 304
    this.webResponse = new Response(none ? null : webBody(this.reader(true)), {
      status: this.status,
      headers,
    })
    return this.webResponse
  }
}

/** A web stream over a BodyReader (one read per pull). */
function webBody(reader: BodyReader): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>(
    {
      async pull(c) {
        const r = await reader.read()
        if (r.done) c.close()
        else c.enqueue(r.value)
      },
      cancel: (reason) => reader.cancel(reason),
    },
    { highWaterMark: 0 },
  )
}

/**
 * The response body as it arrives: a queue bounded by pausing the socket. It listens to the
 * request's signal until it is read to its end: an abort drops what waits unread and fails every
 * read after with the abort's reason, as a fetch body does.
 */
class Body implements BodyReader {
  private queue: Uint8Array[] = []
  private queued = 0
  private paused = false
  private resolve: ((r: ReadableStreamReadResult<Uint8Array>) => void) | undefined
  private reject: ((err: unknown) => void) | undefined
  private ended = false
  private error: unknown
  private failed = false

  constructor(
    private readonly conn: Conn,
    private signal: AbortSignal | undefined,
  ) {
    signal?.addEventListener('abort', this)
  }

  /** The signal's abort (the body is its listener: no closure per exchange). */
  handleEvent(): void {
    this.abort(this.signal?.reason)
  }

  /** Drops what waits unread, fails every read after with `reason`, and lets the socket go. */
  abort(reason: unknown): void {
    this.fail(reason)
    this.conn.abandon(this, reason)
  }

  private unlisten(): void {
    this.signal?.removeEventListener('abort', this)
    this.signal = undefined
  }

  read(): Promise<ReadableStreamReadResult<Uint8Array>> {
    if (this.queue.length > 0) {
      const value = this.queue.shift()!
      this.queued -= value.byteLength
      if (this.paused && this.queued <= LOW_WATER) {
        this.paused = false
        this.conn.socket?.resume()
      }
      return Promise.resolve({ done: false, value })
    }
    if (this.failed) return Promise.reject(this.error)
    if (this.ended) {
      this.unlisten()
      return Promise.resolve({ done: true, value: undefined })
    }
    return new Promise((resolve, reject) => {
      this.resolve = resolve
      this.reject = reject
    })
  }

  cancel(): Promise<void> {
    this.fail(new Error('the body was cancelled'))
    this.conn.abandon(this, undefined)
    return Promise.resolve()
  }

  push(value: Uint8Array): void {
    if (this.failed || this.ended) return
    const resolve = this.resolve
    if (resolve) {
      this.resolve = this.reject = undefined
      resolve({ done: false, value })
      return
    }
    this.queue.push(value)
    this.queued += value.byteLength
    if (!this.paused && this.queued > HIGH_WATER) {
      this.paused = true
      this.conn.socket?.pause()
    }
  }

  /** The answer is whole; what is queued is still read, then the end. */
  end(): void {
    if (this.failed || this.ended) return
    this.ended = true
    // The socket goes back to the pool: it must read again, whatever is left unread here.
    if (this.paused) {
      this.paused = false
      this.conn.socket?.resume()
    }
    const resolve = this.resolve
    if (resolve) {
      this.resolve = this.reject = undefined
      this.unlisten()
      resolve({ done: true, value: undefined })
    }
  }

  /** Fails the body unless it was read to its end; what waits unread is dropped. */
  fail(err: unknown): void {
    if (this.failed || (this.ended && this.queue.length === 0)) return
    this.failed = true
    this.error = err
    this.queue = []
    this.queued = 0
    this.unlisten()
    const reject = this.reject
    this.resolve = this.reject = undefined
    reject?.(err)
  }
}

type Socket = Bun.Socket<Conn>
/** Opens a socket, as Bun.connect does. */
export type Dial = (options: Bun.TCPSocketConnectOptions<Conn>) => Promise<Socket>

/** One connection to an origin, with at most one exchange at a time. */
class Conn {
  socket: Socket | undefined
  /** Whether it served an exchange before this one (a pooled socket). */
  reused = false
  closed = false
  /** Why the TLS handshake failed, if it did. */
  tlsError: Error | undefined
  phase = Phase.Idle
  /** Request bytes the socket has not taken yet. */
  private unsent: Uint8Array | undefined
  private headBytes: Buffer | undefined
  /** A trailer line's start, when a read ended inside it. */
  private line = ''
  /** The chunk-size line being read: its value, digits, and whether its digits have ended. */
  private size = 0
  private digits = 0
  private lineBytes = 0
  private sizeDone = false
  private inExtension = false
  /** A chunk's CR came, its LF not yet. */
  private crSeen = false
  private remaining = 0
  private trailerBytes = 0
  private answered = false
  /** When the request's last byte went to the socket (infinity until then). */
  private sentAtMs = Number.POSITIVE_INFINITY
  /** When it went back to the pool, and how long the server keeps an idle socket (its hint). */
  idleSinceMs = 0
  keepForMs = IDLE_MS
  private keepAlive = false
  private onHead: ((r: H1Response) => void) | undefined
  private onFail: ((err: unknown) => void) | undefined
  private body: Body | undefined

  constructor(
    readonly pool: H1Pool,
    readonly key: string,
  ) {}

  /** Sends the request; resolves with the answer's head. */
  exchange(bytes: Uint8Array, signal: AbortSignal): Promise<H1Response> {
    if (this.closed) return Promise.reject(new ClosedBeforeAnswer('the connection closed before the request'))
    // An abort listener added now would never fire: an aborted request goes no further.
    if (signal.aborted) {
      this.pool.release(this)
      return Promise.reject(signal.reason)
    }
    return new Promise<H1Response>((resolve, reject) => {
      this.phase = Phase.Head
      this.answered = false
      this.sentAtMs = Number.POSITIVE_INFINITY
      this.onHead = resolve
      this.onFail = reject
      this.body = new Body(this, signal)
      this.write(bytes)
    })
  }

  /**
   * Its body was aborted or cancelled: if the answer is still arriving, the head's promise fails
   * with the reason and the socket is closed (it cannot be reused mid-answer).
   */
  abandon(body: Body, reason: unknown): void {
    if (this.body !== body) return
    if (reason !== undefined) this.failExchange(reason)
    this.body = undefined
    this.destroy()
  }

  private write(bytes: Uint8Array): void {
    const socket = this.socket
    if (!socket || this.closed) return
    const n = socket.write(bytes)
    this.unsent = n < bytes.byteLength ? bytes.subarray(Math.max(0, n)) : undefined
    if (this.unsent === undefined) this.sentAtMs = performance.now()
  }

  drain(): void {
    const rest = this.unsent
    if (rest) this.write(rest)
  }

  feed(data: Buffer): void {
    if (this.phase === Phase.Idle || this.phase === Phase.Done) {
      // Bytes no request asked for: the connection can no longer be trusted.
      this.destroy()
      return
    }
    this.answered = true
    let at = 0
    try {
      while (at < data.byteLength && !this.closed) at = this.step(data, at)
    } catch (err) {
      this.failExchange(err)
      this.destroy()
    }
  }

  /**
   * Consumes what it can of `b` from `at` in the current phase; returns where it stopped. The
   * chunk framing is read byte by byte, with no string or view made for it: a stream's events
   * come one chunk each, and this runs for every one.
   */
  private step(b: Buffer, at: number): number {
    switch (this.phase) {
      case Phase.Head: {
        let h = at === 0 ? b : b.subarray(at)
        const before = this.headBytes?.byteLength ?? 0
        if (this.headBytes) {
          h = Buffer.concat([this.headBytes, h])
          this.headBytes = undefined
        }
        const end = h.indexOf('\r\n\r\n')
        if (end < 0) {
          if (h.byteLength > MAX_HEAD_BYTES) throw new UpstreamProtocolError('the response head is too large')
          if (h.indexOf('\n\n') >= 0)
            throw new UpstreamProtocolError('a response head ended by bare line feeds')
          this.headBytes = h
          return b.byteLength
        }
        if (end > MAX_HEAD_BYTES) throw new UpstreamProtocolError('the response head is too large')
        this.head(h.toString('latin1', 0, end))
        // The terminator ends in this read's bytes (else an earlier read had found it).
        return at + end + 4 - before
      }
      case Phase.ChunkSize: {
        const n = b.byteLength
        for (let i = at; i < n; i++) {
          const c = b[i]!
          if (c === 10) {
            if (this.digits === 0) throw new UpstreamProtocolError('a malformed chunk size')
            const size = this.size
            this.size = this.digits = this.lineBytes = 0
            this.sizeDone = this.inExtension = false
            if (size === 0) {
              this.phase = Phase.Trailer
              this.trailerBytes = 0
            } else {
              this.remaining = size
              this.phase = Phase.ChunkData
            }
            return i + 1
          }
          if (++this.lineBytes > MAX_LINE_BYTES) throw new UpstreamProtocolError('a chunk line is too long')
          if (this.inExtension) continue
          const v = HEX_VALUE[c]!
          if (v >= 0 && !this.sizeDone) {
            if (++this.digits > 12) throw new UpstreamProtocolError('a malformed chunk size')
            this.size = this.size * 16 + v
          } else if (c === 59)
            this.inExtension = true // ';': an extension, ignored
          else if (c === 13 || c === 32 || c === 9) this.sizeDone = true
          else throw new UpstreamProtocolError('a malformed chunk size')
        }
        return n
      }
      case Phase.ChunkEnd: {
        let i = at
        if (!this.crSeen && b[i] === 13) {
          this.crSeen = true
          if (++i === b.byteLength) return i
        }
        if (b[i] !== 10) throw new UpstreamProtocolError('a chunk is longer than its size')
        this.crSeen = false
        this.phase = Phase.ChunkSize
        return i + 1
      }
      case Phase.Trailer: {
        const nl = b.indexOf(10, at)
        if (nl < 0) {
          this.line += b.toString('latin1', at)
          if (this.line.length > MAX_LINE_BYTES) throw new UpstreamProtocolError('a trailer line is too long')
          return b.byteLength
        }
        let line = this.line + b.toString('latin1', at, nl)
        this.line = ''
        if (line.length > MAX_LINE_BYTES) throw new UpstreamProtocolError('a trailer line is too long')
        if (line.endsWith('\r')) line = line.slice(0, -1)
        this.trailerBytes += line.length + 2
        if (this.trailerBytes > MAX_TRAILER_BYTES)
          throw new UpstreamProtocolError('the trailers are too large')
        if (line === '') this.complete()
        return nl + 1
      }
      case Phase.ChunkData:
      case Phase.Length: {
        const n = Math.min(this.remaining, b.byteLength - at)
        this.body!.push(at === 0 && n === b.byteLength ? b : b.subarray(at, at + n))
        this.remaining -= n
        if (this.remaining === 0) {
          if (this.phase === Phase.Length) this.complete()
          else this.phase = Phase.ChunkEnd
        }
        return at + n
      }
      case Phase.UntilClose:
        this.body!.push(at === 0 ? b : b.subarray(at))
        return b.byteLength
      default:
        throw new UpstreamProtocolError('bytes after the response')
    }
  }

  private head(text: string): void {
    const lines = text.split('\r\n')
    const status = STATUS_LINE.exec(lines[0]!)
    if (!status) throw new UpstreamProtocolError('a malformed status line')
    const code = Number(status[2])
    let encoded = false
    let length: number | undefined
    let close = status[1] === '0'
    let encoding: string | undefined
    let location: string | undefined
    for (let i = 1; i < lines.length; i++) {
      const l = lines[i]!
      const colon = l.indexOf(':')
      // No space before the colon, no folded line (RFC 9112, 5): both have smuggled requests.
      if (colon <= 0 || !FIELD_NAME.test(l.slice(0, colon)))
        throw new UpstreamProtocolError('a malformed header line')
      const name = l.slice(0, colon).toLowerCase()
      const value = l.slice(colon + 1).trim()
      if (name === 'transfer-encoding') {
        // Only chunked alone: a stacked coding (gzip, chunked) would pass its bytes on coded.
        if (encoded || value.toLowerCase() !== 'chunked')
          throw new UpstreamProtocolError(`an unsupported transfer-encoding: ${value.slice(0, 64)}`)
        encoded = true
      } else if (name === 'keep-alive') {
        const t = /(?:^|,)\s*timeout\s*=\s*(\d+)/i.exec(value)
        if (t) this.keepForMs = Math.min(IDLE_MS, Number(t[1]) * 1000 - 1000)
      } else if (name === 'location') {
        location = value
      } else if (name === 'content-length') {
        if (!DIGITS.test(value)) throw new UpstreamProtocolError('a malformed content-length')
        const n = Number(value)
        if (length !== undefined && length !== n)
          throw new UpstreamProtocolError('conflicting content-lengths')
        length = n
      } else if (name === 'connection') {
        if (/(?:^|,)\s*close\s*(?:,|$)/i.test(value)) close = true
        else if (status[1] === '0' && /(?:^|,)\s*keep-alive\s*(?:,|$)/i.test(value)) close = false
      } else if (name === 'content-encoding') {
        const e = value.toLowerCase()
        if (e === 'gzip' || e === 'x-gzip') encoding = 'gzip'
        else if (e === 'deflate') encoding = 'deflate'
        else if (e !== 'identity' && e !== '')
          throw new UpstreamProtocolError(`unsupported content-encoding ${e}`)
      }
    }
    // 1xx: an interim answer (103 Early Hints, an unasked-for 100); the real one follows.
    if (code < 200) return
    this.keepAlive = !close
    if (code === 204 || code === 304) this.phase = Phase.Done
    else if (encoded) {
      // Chunked (any other transfer coding was refused above); a length beside it is ignored,
      // and the socket not reused (RFC 9112, 6.3).
      this.phase = Phase.ChunkSize
      if (length !== undefined) this.keepAlive = false
    } else if (length !== undefined) {
      this.remaining = length
      this.phase = length === 0 ? Phase.Done : Phase.Length
    } else {
      this.phase = Phase.UntilClose
      this.keepAlive = false
    }
    const onHead = this.onHead
    this.onHead = this.onFail = undefined
    onHead?.(new H1Response(code, text.slice(lines[0]!.length + 2), this.body!, encoding, location))
    if (this.phase === Phase.Done) this.complete()
  }

  /** The answer is whole: its reader ends; the socket goes back to the pool if it may. */
  private complete(): void {
    this.phase = Phase.Done
    const body = this.body
    this.body = undefined
    body?.end()
    if (this.keepAlive && !this.closed && this.unsent === undefined) {
      this.phase = Phase.Idle
      this.pool.release(this)
    } else this.destroy()
  }

  /** Fails the head's promise or the body's reader, whichever is waiting. */
  private failExchange(err: unknown): void {
    const onFail = this.onFail
    this.onHead = this.onFail = undefined
    onFail?.(err)
    this.body?.fail(err)
    this.body = undefined
  }

  /** The server closed (or the socket broke): ends a body read to the close, fails the rest. */
  closedBy(err: Error | undefined): void {
    if (this.closed) return
    err ??= this.tlsError
    this.closed = true
    this.unsent = undefined
    this.pool.forget(this)
    if (this.phase === Phase.UntilClose && err === undefined) {
      this.complete()
      return
    }
    if (this.phase === Phase.Idle || this.phase === Phase.Done) return
    const why = err ? `the connection failed: ${err.message}` : undefined
    // Closed at once, with nothing answered: the server had closed the socket before the request
    // came (its idle timeout racing ours), so the request may be sent again. Later, it may have
    // been at work on it: then the close is the answer.
    if (this.answered) this.failExchange(new Error(why ?? 'the connection closed mid-answer'))
    else if (performance.now() - this.sentAtMs < this.pool.raceMs)
      this.failExchange(new ClosedBeforeAnswer(why ?? 'the connection closed before an answer'))
    else
      this.failExchange(
        Object.assign(new Error(why ?? 'the connection closed before an answer'), { code: 'ECONNRESET' }),
      )
  }

  destroy(): void {
    const was = this.closed
    this.closedBy(undefined)
    if (!was) this.socket?.end()
  }
}

/** A byte's value as a hex digit, or -1. */
const HEX_VALUE = new Int8Array(256).fill(-1)
for (let d = 0; d < 16; d++) {
  HEX_VALUE['0123456789abcdef'.charCodeAt(d)] = d
  HEX_VALUE['0123456789ABCDEF'.charCodeAt(d)] = d
}
const DIGITS = /^\d{1,15}$/
const STATUS_LINE = /^HTTP\/1\.([01]) (\d{3})(?: |$)/
const FIELD_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/
/** Characters a header name or value may not hold (they would split the request). */
const UNSAFE = /[\r\n\0]/

const handlers: Bun.SocketHandler<Conn> = {
  data: (s, d) => s.data.feed(d),
  drain: (s) => s.data.drain(),
  end: (s) => s.data.closedBy(undefined),
  close: (s, err) => s.data.closedBy(err),
  error: (s, err) => s.data.closedBy(err),
  timeout: (s) => s.data.destroy(),
  // Bun refuses a certificate that does not verify (closing the socket); the reason is kept for
  // the error the exchange fails with.
  handshake: (s, ok, err) => {
    if (!ok && err) s.data.tlsError = err
  },
}

/** Whether a redirect from `from` to `to` stays with the origin (or moves it to https, same host). */
function sameOrigin(from: URL, to: URL): boolean {
  if (to.origin === from.origin) return true
  return (
    from.protocol === 'http:' &&
    to.protocol === 'https:' &&
    to.hostname === from.hostname &&
    (to.port === '' || to.port === from.port)
  )
}

/** Keep-alive sockets per origin, and the requests made over them. */
export class H1Pool {
  private readonly idle = new Map<string, Conn[]>()
  /** A number for each route CA seen, for the pool's keys (not a hash of the PEM every request). */
  private readonly cas = new Map<string, number>()

  /**
   * `dial` opens a socket (Bun.connect; a test gives one that connects late); `raceMs` is how
   * soon after the request a close with nothing answered counts as a stale socket's (RACE_MS).
   */
  constructor(
    private readonly dial: Dial = Bun.connect,
    readonly raceMs = RACE_MS,
  ) {}

  /**
   * Sends `req`; resolves with the answer's head (its body unread), rejects as fetch would: with
   * the signal's reason once it aborts, whatever the request was doing (connecting included).
   * Follows 307 and 308 within the origin (or to https on the same host), as fetch would.
   */
  async post(req: H1Request): Promise<H1Response> {
    let url = req.url
    for (let hops = 0; ; hops++) {
      const res = await this.once(req, url)
      if (res.status < 300 || res.status > 399 || res.status === 304) return res
      // A redirect not followed is the node's failure (fetch would have followed it), never the
      // request refused.
      await res.reader().cancel()
      let next: URL | undefined
      try {
        next = new URL(res.location ?? '', url)
      } catch {
        // no usable Location
      }
      if (
        next === undefined ||
        (res.status !== 307 && res.status !== 308) ||
        hops >= MAX_REDIRECTS ||
        !sameOrigin(url, next)
      )
        throw new UpstreamProtocolError(
          `answered ${res.status}${next ? ` to ${next.origin}${next.pathname}` : ''}, not followed`,
        )
      url = next
    }
  }

  private async once(req: H1Request, url: URL): Promise<H1Response> {
    const key = req.ca === undefined ? url.origin : `${url.origin}#${this.caId(req.ca)}`
    for (let fresh = false; ; fresh = true) {
      const conn = (fresh ? undefined : this.take(key)) ?? (await this.connect(req, url, key))
      try {
        // The request's bytes are made here, not kept across the wait for the answer's head.
        return await conn.exchange(encode(req, url), req.signal)
      } catch (err) {
        // A pooled socket the server closed as the request came: it cannot have been processed
        // (closedBy); once more, on a new socket.
        if (err instanceof ClosedBeforeAnswer && conn.reused && !fresh && !req.signal.aborted) continue
        throw err
      }
    }
  }

  private caId(ca: string): number {
    let id = this.cas.get(ca)
    if (id === undefined) {
      id = this.cas.size
      this.cas.set(ca, id)
    }
    return id
  }

  /** A new socket; the signal's abort rejects at once (a socket that connects later is closed). */
  private connect(req: H1Request, url: URL, key: string): Promise<Conn> {
    const signal = req.signal
    if (signal.aborted) return Promise.reject(signal.reason)
    const conn = new Conn(this, key)
    const tls = url.protocol === 'https:'
    const hostname = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname
    const port = Number(url.port) || (tls ? 443 : 80)
    // The name the certificate must carry (an address too: Bun checks it against the IP SANs and
    // reports the reason a handshake failed only when it is given).
    const serverName = { serverName: hostname }
    const connecting = this.dial({
      hostname,
      port,
      data: conn,
      socket: handlers,
      ...(tls && { tls: req.ca === undefined ? serverName : { ca: req.ca, ...serverName } }),
    })
    return new Promise<Conn>((resolve, reject) => {
      const onAbort = () => {
        reject(signal.reason)
        connecting.then(
          (socket) => socket.end(),
          () => {},
        )
      }
      signal.addEventListener('abort', onAbort, { once: true })
      connecting.then(
        (socket) => {
          signal.removeEventListener('abort', onAbort)
          if (signal.aborted) return
          conn.socket = socket
          socket.setNoDelay(true)
          resolve(conn)
        },
        (err: unknown) => {
          signal.removeEventListener('abort', onAbort)
          reject(err)
        },
      )
    })
  }

  /** The most recently used live socket kept for `key`, if it is younger than its keep time. */
  private take(key: string): Conn | undefined {
    const list = this.idle.get(key)
    if (!list) return undefined
    const now = performance.now()
    for (;;) {
      const conn = list.pop()
      if (!conn) return undefined
      if (conn.closed) continue
      if (now - conn.idleSinceMs > conn.keepForMs) {
        // The server may close it any moment now: not worth the race.
        conn.destroy()
        continue
      }
      conn.socket?.timeout(0)
      conn.socket?.ref()
      return conn
    }
  }

  /** An exchange ended with the socket reusable. */
  release(conn: Conn): void {
    conn.reused = true
    let list = this.idle.get(conn.key)
    if (!list) {
      list = []
      this.idle.set(conn.key, list)
    }
    if (list.length >= MAX_IDLE_PER_ORIGIN || conn.keepForMs <= 0) {
      conn.destroy()
      return
    }
    conn.idleSinceMs = performance.now()
    // An idle socket keeps the process alive no longer, and closes within IDLE_TIMEOUT_SECONDS.
    conn.socket?.timeout(IDLE_TIMEOUT_SECONDS)
    conn.socket?.unref()
    list.push(conn)
  }

  /** A socket closed: out of the pool if it was there. */
  forget(conn: Conn): void {
    const list = this.idle.get(conn.key)
    if (!list) return
    const i = list.lastIndexOf(conn)
    if (i >= 0) list.splice(i, 1)
    if (list.length === 0) this.idle.delete(conn.key)
  }

  /** Closes every pooled socket. */
  close(): void {
    for (const list of this.idle.values()) for (const conn of [...list]) conn.destroy()
    this.idle.clear()
  }
}

/**
 * The request's bytes, head and body, as fetch would send them: a configured Host and the URL's
 * credentials (as Basic authorization) honoured; no compression asked for.
 */
function encode(req: H1Request, url: URL): Buffer {
  const { headers, body } = req
  let host = url.host
  let lines = ''
  let agent = false
  let accept = false
  let authorization = false
  for (const name in headers) {
    const value = headers[name]!
    if (UNSAFE.test(name) || UNSAFE.test(value)) throw new TypeError(`header ${name} holds a line break`)
    const lower = name.toLowerCase()
    if (lower === 'host') {
      host = value
      continue
    }
    if (lower === 'content-length' || lower === 'transfer-encoding' || lower === 'connection') continue
    if (lower === 'user-agent') agent = true
    else if (lower === 'accept-encoding') accept = true
    else if (lower === 'authorization') authorization = true
    lines += `${name}: ${value}\r\n`
  }
  if (!authorization && (url.username !== '' || url.password !== '')) {
    const user = decodeURIComponent(url.username)
    const password = decodeURIComponent(url.password)
    lines += `authorization: Basic ${Buffer.from(`${user}:${password}`).toString('base64')}\r\n`
  }
  if (!agent) lines += `user-agent: Bun/${Bun.version}\r\n`
  if (!accept) lines += 'accept-encoding: identity\r\n'
  const size = Buffer.byteLength(body)
  const head = `POST ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${host}\r\n${lines}content-length: ${size}\r\n\r\n`
  const headSize = Buffer.byteLength(head)
  // The body written into place, not joined to the head first (a second copy of the prompt).
  const bytes = Buffer.allocUnsafe(headSize + size)
  bytes.write(head, 0)
  bytes.write(body, headSize)
  return bytes
}

/** The process's pool for streamed upstream calls. */
export const upstreamPool = new H1Pool()

/**
 * Which client streamed calls use: Tropa's own, unless a proxy is configured in the environment
 * (fetch honours HTTP_PROXY, HTTPS_PROXY and NO_PROXY; this client does not speak to proxies) or
 * TROPA_STREAM_CLIENT=fetch asks for fetch (docs/providers.md, "Connections").
 */
let streamsOwn =
  process.env.TROPA_STREAM_CLIENT !== 'fetch' &&
  !['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy', 'ALL_PROXY', 'all_proxy'].some(
    (v) => (process.env[v] ?? '') !== '',
  )

/** Whether a streamed call to `url` goes over Tropa's own client (http and https). */
export function ownClientServes(url: string): boolean {
  return streamsOwn && (url.startsWith('http://') || url.startsWith('https://'))
}

/** Sends streamed calls through fetch from now on (a benchmark replaying fetch does this). */
export function streamOverFetch(): void {
  streamsOwn = false
}
