import busboy from 'busboy'
import {
  InsufficientStorage,
  InvalidValue,
  isDiskFull,
  NotFound,
  PayloadTooLarge,
  quoted,
  TropaError,
  UnsupportedMediaType,
} from '../errors.ts'
import { sortableId } from '../ids.ts'
import type { FileRecord, Store } from '../storage/store.ts'
import type { DiskWatch } from './disk.ts'
import type { FileStore, FileWriter } from './file-store.ts'
import { sanitizeFilename } from './names.ts'

export interface FileLimits {
  readonly maxBytes: number
  readonly maxLines: number
  /** Uploads stop (507) rather than leave less free space than this: room kept for the database. */
  readonly minFreeBytes?: number
}

/** An upload in progress checks the free space again after every this many bytes. */
const FREE_CHECK_BYTES = 8 * 1024 * 1024

export const fileNotFound = (id: string) => new NotFound(`no file ${quoted(id)}`, 'file_not_found')

/** An uploaded batch file: parsed fields and what was written. */
interface Upload {
  fields: Record<string, string>
  file: FileRecord | undefined
}

/** Bytes a multipart body may carry beyond its file (boundaries, part headers, the text fields). */
export const MULTIPART_SLACK_BYTES = 64 * 1024
/** Longest text field of a multipart form (purpose, endpoint, metadata...). */
const MAX_FIELD_BYTES = 16 * 1024

/** The `boundary` parameter of a multipart content type (RFC 2046), or undefined. */
function boundaryOf(contentType: string): string | undefined {
  const m = /;\s*boundary\s*=\s*(?:"([^"]{1,70})"|([^\s;"]{1,70}))/i.exec(contentType)
  return m?.[1] ?? m?.[2]
}

/**
 * The Files API: uploads stream from the request through a multipart parser straight into the
 * FileStore, counting bytes and lines on the way, so a 200 MB file never sits in memory. A file
 * is written under a temporary name and becomes visible (renamed, then its row inserted) only when
 * the whole upload succeeded; every failure removes what was written.
 */
export class FilesService {
  constructor(
    private readonly store: Store,
    readonly contents: FileStore,
    private readonly limits: FileLimits,
    /** Told about every write that failed for want of space and every one that succeeded. */
    readonly disk?: DiskWatch,
  ) {}

  async upload(orgId: string, request: Request): Promise<FileRecord> {
    const { file, fields } = await this.uploadForm(orgId, request)
    if (fields.purpose !== 'batch') {
      await this.remove(orgId, file.id)
      throw new InvalidValue('purpose must be "batch"', 'purpose')
    }
    return file
  }

  /** A multipart form with one `file` part (stored) and text fields (returned). */
  async uploadForm(
    orgId: string,
    request: Request,
  ): Promise<{ file: FileRecord; fields: Record<string, string> }> {
    const type = request.headers.get('content-type') ?? ''
    if (!type.toLowerCase().startsWith('multipart/form-data'))
      throw new UnsupportedMediaType(type || '(none)', 'multipart/form-data')
    if (boundaryOf(type) === undefined)
      throw new InvalidValue('the multipart/form-data content type has no boundary parameter', null)
    const declared = Number(request.headers.get('content-length') ?? 0)
    if (declared > this.limits.maxBytes + MULTIPART_SLACK_BYTES)
      throw new PayloadTooLarge(this.limits.maxBytes)
    // A client cannot fill the disk with uploads: the database (keys, the ledger) keeps its room.
    if (!(await this.roomFor(Math.max(declared || 0, 0)))) throw new InsufficientStorage('the file')
    const up = await this.receive(orgId, request, type)
    if (!up.file) throw new InvalidValue('the form has no file field', 'file')
    try {
      await this.store.insertFile(up.file)
    } catch (err) {
      await this.contents.remove(up.file.id)
      throw this.storageError(err, 'the file')
    }
    return { file: up.file, fields: up.fields }
  }

  /** Stores content produced by Tropa itself (batch output and error files). */
  async create(orgId: string, filename: string, purpose: string, content: string): Promise<FileRecord> {
    const id = `file-${sortableId()}`
    let bytes: number
    try {
      bytes = await this.contents.write(id, content)
    } catch (err) {
      throw this.storageError(err, 'the file')
    }
    const rec: FileRecord = {
      id,
      orgId,
      filename,
      purpose,
      bytes,
      lines: content.length === 0 ? 0 : content.split('\n').filter(Boolean).length,
      createdAt: Math.floor(Date.now() / 1000),
      deletedAt: null,
    }
    try {
      await this.store.insertFile(rec)
    } catch (err) {
      await this.contents.remove(id)
      throw this.storageError(err, 'the file')
    }
    this.disk?.ok()
    return rec
  }

  /** A live file of this organization; another organization's is not found. */
  async get(orgId: string, id: string): Promise<FileRecord> {
    const f = await this.store.getFile(id)
    if (!f || f.orgId !== orgId || f.deletedAt !== null) throw fileNotFound(id)
    return f
  }

  /** A live file by id alone (signed download links carry no organization). */
  async getAny(id: string): Promise<FileRecord> {
    const f = await this.store.getFile(id)
    if (!f || f.deletedAt !== null) throw fileNotFound(id)
    return f
  }

  list(orgId: string, afterId: string | undefined, limit: number) {
    return this.store.listFiles(orgId, afterId, limit)
  }

  async remove(orgId: string, id: string): Promise<void> {
    await this.get(orgId, id)
    await this.store.markFileDeleted(id, Math.floor(Date.now() / 1000))
    await this.contents.remove(id)
  }

  /**
   * Removes what failed uploads and crashes left in the files directory: temporary files and
   * files without a row, once idle for `graceMs` (other nodes sharing the directory may be
   * writing theirs right now). Run at start-up.
   */
  sweep(graceMs: number): Promise<number> {
    // A deleted file's content is removed with it; a crash in between leaves it for this sweep.
    return this.contents.sweep(async (id) => {
      const row = await this.store.getFile(id)
      return row !== undefined && row.deletedAt === null
    }, graceMs)
  }

  /** Whether `bytes` more leave at least `minFreeBytes` free. */
  private async roomFor(bytes: number): Promise<boolean> {
    const reserve = this.limits.minFreeBytes ?? 0
    if (reserve <= 0) return true
    return (await this.contents.freeBytes()) - bytes >= reserve
  }

  /** A write's error as the client should see it: a full disk is 507 (and the disk watch hears of it). */
  private storageError(err: unknown, what: string): unknown {
    if (err instanceof TropaError) return err
    if (this.disk ? this.disk.report(err) : isDiskFull(err)) return new InsufficientStorage(what)
    return err
  }

  private receive(orgId: string, request: Request, contentType: string): Promise<Upload> {
    const { maxBytes, maxLines } = this.limits
    const body = request.body
    if (!body) return Promise.reject(new InvalidValue('the request has no body', 'file'))
    return new Promise<Upload>((resolve, reject) => {
      const up: Upload = { fields: {}, file: undefined }
      let settled = false
      let out: FileWriter | undefined
      let stored: Promise<void> = Promise.resolve()
      const reader = body.getReader()
      // Any failure answers at once (the rest of the body is not read) and removes what was written.
      const fail = (err: unknown) => {
        if (settled) return
        settled = true
        reader.cancel().catch(() => {})
        parser.destroy()
        const written = out
        void (written ? written.abort() : Promise.resolve()).then(() =>
          reject(this.storageError(err, 'the file')),
        )
      }
      let parser: ReturnType<typeof busboy>
      try {
        parser = busboy({
          headers: { 'content-type': contentType },
          limits: { fileSize: maxBytes, files: 1, fields: 8, parts: 16, fieldSize: MAX_FIELD_BYTES },
        })
      } catch (err) {
        reject(new InvalidValue(`malformed multipart content type: ${(err as Error).message}`, null))
        return
      }
      parser.on('field', (name, value, info) => {
        if (info.valueTruncated)
          fail(new InvalidValue(`the form field ${name} is longer than ${MAX_FIELD_BYTES} bytes`, name))
        else up.fields[name] = value
      })
      parser.on('partsLimit', () => fail(new InvalidValue('the form has more than 16 parts', null)))
      parser.on('file', (name, stream, info) => {
        if (name !== 'file' || out) {
          stream.resume()
          return
        }
        const id = `file-${sortableId()}`
        const writer = this.contents.writer(id)
        out = writer
        let bytes = 0
        let lines = 0
        let last = 10
        let nextFreeCheck = FREE_CHECK_BYTES
        stream.on('data', (chunk: Buffer) => {
          if (settled) return
          bytes += chunk.length
          for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) lines++
          last = chunk[chunk.length - 1] ?? last
          if (lines > maxLines)
            return fail(new InvalidValue(`the file has more than ${maxLines} lines`, 'file'))
          let wait = writer.write(chunk)
          if (bytes >= nextFreeCheck) {
            nextFreeCheck = bytes + FREE_CHECK_BYTES
            const written = wait ?? Promise.resolve()
            wait = written
              .then(() => this.roomFor(0))
              .then((room) => {
                if (!room) throw new InsufficientStorage('the file')
              })
          }
          if (wait) {
            // The disk sets the pace: the parser stops, and so does reading the request.
            stream.pause()
            wait.then(() => stream.resume(), fail)
          }
        })
        stream.on('limit', () => fail(new PayloadTooLarge(maxBytes)))
        // A truncated part; the parser's own 'error' says the same.
        stream.on('error', (err: Error) =>
          fail(new InvalidValue(`malformed multipart body: ${err.message}`, null)),
        )
        stored = new Promise<void>((done) => {
          stream.on('end', () => {
            if (settled) return done()
            if (last !== 10 && bytes > 0) lines++ // a last line without its newline
            if (lines > maxLines) {
              fail(new InvalidValue(`the file has more than ${maxLines} lines`, 'file'))
              return done()
            }
            // The last bytes must not eat into the reserve either.
            writer
              .commit()
              .then(async () => {
                if (!(await this.roomFor(0))) throw new InsufficientStorage('the file')
              })
              .then(
                () => {
                  this.disk?.ok()
                  up.file = {
                    id,
                    orgId,
                    filename: sanitizeFilename(info.filename),
                    purpose: 'batch',
                    bytes,
                    lines,
                    createdAt: Math.floor(Date.now() / 1000),
                    deletedAt: null,
                  }
                  done()
                },
                (err) => {
                  fail(err)
                  done()
                },
              )
          })
        })
      })
      parser.on('error', (err: Error) =>
        fail(new InvalidValue(`malformed multipart body: ${err.message}`, null)),
      )
      parser.on('close', async () => {
        await stored
        if (settled) {
          // Failed after its file was committed: fail() removed it.
          return
        }
        settled = true
        resolve(up)
      })
      // Read the body by hand: every byte is counted (parts the parser skips too), and the parser's
      // backpressure (a paused file stream) stops the reading.
      const cap = maxBytes + MULTIPART_SLACK_BYTES
      const pump = async () => {
        let total = 0
        try {
          for (;;) {
            const { done, value } = await reader.read()
            if (settled) return
            if (done) break
            total += value.byteLength
            if (total > cap) return fail(new PayloadTooLarge(maxBytes))
            if (!parser.write(value)) await drained(parser)
          }
          parser.end()
        } catch {
          // The client went away mid-body.
          fail(new InvalidValue('the upload was interrupted', 'file'))
        }
      }
      void pump()
    })
  }
}

/** Resolves when a writable stream takes more, or can take nothing any more. */
function drained(w: import('node:stream').Writable): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      w.off('drain', done)
      w.off('close', done)
      w.off('error', done)
      resolve()
    }
    w.on('drain', done)
    w.on('close', done)
    w.on('error', done)
  })
}

export function fileView(f: FileRecord) {
  return {
    id: f.id,
    object: 'file' as const,
    bytes: f.bytes,
    created_at: f.createdAt,
    filename: f.filename,
    purpose: f.purpose,
    status: 'processed' as const,
  }
}
