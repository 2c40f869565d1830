import { existsSync, renameSync, rmSync, statSync } from 'node:fs'
import { type FileHandle, open } from 'node:fs/promises'

export interface AccessLogOptions {
  /** Where lines go: stderr, or a file rotated by size. */
  readonly sink: 'stderr' | 'file'
  /** The file (sink "file"); rotated to `<path>.1` … `<path>.<keep>`. */
  readonly path: string
  /** A file is rotated before it grows past this many bytes. */
  readonly maxBytes: number
  /** Rotated files kept. */
  readonly keep: number
  /** Lines held while a write is under way; past this, lines are dropped and counted. */
  readonly bufferLines: number
  /** Characters held (lines with captured bodies are big); past this, lines are dropped and counted. */
  readonly bufferBytes: number
}

/**
 * One JSON line per request, written off the request path: a request only appends its line to a
 * bounded buffer; the buffer is written in one piece at the next turn of the event loop, one
 * write at a time. When the sink is slower than the traffic, the buffer fills and further lines
 * are dropped (and counted), never waited for.
 */
export class AccessLog {
  /** Lines dropped because the buffer was full. */
  dropped = 0
  /** Lines written. */
  written = 0
  private lines: string[] = []
  private queuedChars = 0
  private scheduled = false
  private writing: Promise<void> | undefined
  private file: FileHandle | undefined
  private size = 0
  private stopped = false

  constructor(
    private readonly opts: AccessLogOptions,
    private readonly onError: (err: unknown) => void,
  ) {}

  /** Queues one line (a JSON object's text, without the newline). */
  push(line: string): void {
    if (
      this.stopped ||
      this.lines.length >= this.opts.bufferLines ||
      this.queuedChars + line.length > this.opts.bufferBytes
    ) {
      this.dropped++
      return
    }
    this.lines.push(line)
    this.queuedChars += line.length
    if (!this.scheduled && this.writing === undefined) {
      this.scheduled = true
      setImmediate(this.flush)
    }
  }

  private readonly flush = (): void => {
    this.scheduled = false
    if (this.lines.length === 0 || this.writing !== undefined) return
    const batch = this.lines
    this.lines = []
    this.queuedChars = 0
    this.writing = this.write(batch)
      .catch((err) => {
        this.dropped += batch.length
        this.onError(err)
      })
      .finally(() => {
        this.writing = undefined
        if (this.lines.length > 0) this.flush()
      })
  }

  private async write(batch: readonly string[]): Promise<void> {
    if (this.opts.sink === 'stderr') {
      const text = `${batch.join('\n')}\n`
      await new Promise<void>((resolve) => {
        if (process.stderr.write(text)) resolve()
        else process.stderr.once('drain', resolve)
      })
    } else {
      if (this.file === undefined) await this.openFile()
      // Lines go to the file until the next would take it past maxBytes; then it is rotated and
      // the rest go to the new one (a batch gathered while the loop was busy may be bigger than a
      // whole file). A single line longer than maxBytes gets a file of its own.
      let from = 0
      let bytes = 0
      for (let i = 0; i < batch.length; i++) {
        const n = Buffer.byteLength(batch[i]!) + 1
        if (this.size + bytes > 0 && this.size + bytes + n > this.opts.maxBytes) {
          if (i > from) await this.append(batch.slice(from, i))
          await this.rotate()
          from = i
          bytes = 0
        }
        bytes += n
      }
      await this.append(batch.slice(from))
    }
    this.written += batch.length
  }

  /** Writes lines to the open file whole (a write may take less than it was given; the rest follows). */
  private async append(lines: readonly string[]): Promise<void> {
    const bytes = Buffer.from(`${lines.join('\n')}\n`)
    for (let at = 0; at < bytes.length; ) {
      const { bytesWritten } = await this.file!.write(bytes, at, bytes.length - at)
      if (bytesWritten <= 0) throw new Error('access log: the file took no bytes')
      at += bytesWritten
    }
    this.size += bytes.length
  }

  private async openFile(): Promise<void> {
    this.file = await open(this.opts.path, 'a', 0o600)
    this.size = existsSync(this.opts.path) ? statSync(this.opts.path).size : 0
  }

  /** access.log -> access.log.1 -> … -> access.log.<keep> (the oldest is removed). */
  private async rotate(): Promise<void> {
    await this.file?.close()
    this.file = undefined
    const { path, keep } = this.opts
    if (keep === 0) rmSync(path, { force: true })
    else {
      rmSync(`${path}.${keep}`, { force: true })
      for (let i = keep - 1; i >= 1; i--)
        if (existsSync(`${path}.${i}`)) renameSync(`${path}.${i}`, `${path}.${i + 1}`)
      renameSync(path, `${path}.1`)
    }
    await this.openFile()
  }

  /** Writes what is buffered and closes the file; later lines are dropped. */
  async stop(): Promise<void> {
    this.flush()
    while (this.writing !== undefined) await this.writing
    this.stopped = true
    await this.file?.close()
    this.file = undefined
  }
}
