import { pipeline, Readable } from 'node:stream'
import busboy from 'busboy'
import { InvalidValue, NotFound, PayloadTooLarge, quoted, UnsupportedMediaType } from '../errors.ts'
import { sortableId } from '../ids.ts'
import type { FileRecord, Store } from '../storage/store.ts'
import type { FileStore } from './file-store.ts'

export interface FileLimits {
  readonly maxBytes: number
  readonly maxLines: number
}

export const fileNotFound = (id: string) => new NotFound(`no file ${quoted(id)}`, 'file_not_found')

/** An uploaded batch file: parsed fields and what was written. */
interface Upload {
  fields: Record<string, string>
  file: FileRecord | undefined
}

/**
 * The Files API: uploads stream from the request through a multipart parser straight into the
 * FileStore, counting bytes and lines on the way, so a 200 MB file never sits in memory.
 */
export class FilesService {
  constructor(
    private readonly store: Store,
    readonly contents: FileStore,
    private readonly limits: FileLimits,
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
    const declared = Number(request.headers.get('content-length') ?? 0)
    if (declared > this.limits.maxBytes + 64 * 1024) throw new PayloadTooLarge(this.limits.maxBytes)
    const up = await this.receive(orgId, request, type)
    if (!up.file) throw new InvalidValue('the form has no file field', 'file')
    await this.store.insertFile(up.file)
    return { file: up.file, fields: up.fields }
  }

  /** Stores content produced by Tropa itself (batch output and error files). */
  async create(orgId: string, filename: string, purpose: string, content: string): Promise<FileRecord> {
    const id = `file-${sortableId()}`
    const bytes = await this.contents.write(id, content)
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
    await this.store.insertFile(rec)
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

  private receive(orgId: string, request: Request, contentType: string): Promise<Upload> {
    const { maxBytes, maxLines } = this.limits
    return new Promise<Upload>((resolve, reject) => {
      const up: Upload = { fields: {}, file: undefined }
      let failure: Error | undefined
      let pending: Promise<void> = Promise.resolve()
      const parser = busboy({
        headers: { 'content-type': contentType },
        limits: { fileSize: maxBytes, files: 1, fields: 8 },
      })
      parser.on('field', (name, value) => {
        up.fields[name] = value
      })
      parser.on('file', (name, stream, info) => {
        if (name !== 'file') {
          stream.resume()
          return
        }
        const id = `file-${sortableId()}`
        const out = this.contents.writer(id)
        let bytes = 0
        let lines = 0
        let last = 10
        stream.on('data', (chunk: Buffer) => {
          if (failure) return
          bytes += chunk.length
          for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) lines++
          last = chunk[chunk.length - 1] ?? last
          if (lines > maxLines) failure = new InvalidValue(`the file has more than ${maxLines} lines`, 'file')
          out.write(chunk)
        })
        stream.on('limit', () => {
          failure = new PayloadTooLarge(maxBytes)
        })
        pending = new Promise<void>((done) => {
          // The client went away mid-part: close the file; pipeline's callback below rejects the
          // upload (an unobserved 'error' event would crash the process).
          stream.on('error', async () => {
            await out.end().catch(() => {})
            done()
          })
          stream.on('end', async () => {
            await out.end()
            if (last !== 10 && bytes > 0) lines++ // a last line without its newline
            if (lines > maxLines)
              failure ??= new InvalidValue(`the file has more than ${maxLines} lines`, 'file')
            up.file = {
              id,
              orgId,
              filename: info.filename || 'upload.jsonl',
              purpose: 'batch',
              bytes,
              lines,
              createdAt: Math.floor(Date.now() / 1000),
              deletedAt: null,
            }
            done()
          })
        })
      })
      parser.on('error', (err: Error) =>
        reject(new InvalidValue(`malformed multipart body: ${err.message}`, null)),
      )
      parser.on('close', async () => {
        await pending
        if (failure) {
          if (up.file) await this.contents.remove(up.file.id)
          reject(failure)
          return
        }
        resolve(up)
      })
      if (!request.body) {
        reject(new InvalidValue('the request has no body', 'file'))
        return
      }
      // pipeline, not pipe: a client that drops the connection mid-upload must reject this
      // upload, not crash the process with an unhandled stream error.
      pipeline(
        Readable.fromWeb(request.body as import('node:stream/web').ReadableStream),
        parser,
        async (err) => {
          if (!err) return
          failure ??= new InvalidValue('the upload was interrupted', 'file')
          await pending
          if (up.file) await this.contents.remove(up.file.id)
          reject(failure)
        },
      )
    })
  }
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
