import { nanoToRubNumber } from '../billing/money.ts'
import { Conflict, InvalidValue, NotFound, PermissionDenied, quoted } from '../errors.ts'
import type { FilesService } from '../files/service.ts'
import { sortableId } from '../ids.ts'
import type { BatchRecord, Store } from '../storage/store.ts'
import type { BatchScheduler } from './scheduler.ts'

export const BATCH_ENDPOINTS = [
  '/v1/chat/completions',
  '/v1/embeddings',
  '/v1/completions',
  '/v1/responses',
] as const

export const batchNotFound = (id: string) => new NotFound(`no batch ${quoted(id)}`, 'batch_not_found')

export interface NewBatch {
  readonly inputFileId: string
  readonly endpoint: string
  readonly completionWindow: string
  readonly metadata: Record<string, string> | null
}

/** Signs download links: HMAC-SHA256 over the file id and expiry with the server secret. */
export class LinkSigner {
  constructor(private readonly secret: string) {}

  sign(fileId: string, expiresAt: number): string {
    return new Bun.CryptoHasher('sha256', this.secret).update(`${fileId}.${expiresAt}`).digest('hex')
  }

  /** Whether a link is genuine and unexpired; comparing in constant time. */
  verify(
    fileId: string,
    expiresAt: number,
    signature: string,
    nowSec = Math.floor(Date.now() / 1000),
  ): boolean {
    if (!Number.isInteger(expiresAt) || expiresAt < nowSec) return false
    const expected = Buffer.from(this.sign(fileId, expiresAt), 'hex')
    const given = Buffer.from(signature, 'hex')
    return given.length === expected.length && crypto.timingSafeEqual(expected, given)
  }
}

/** The Batch API: create, read, list, cancel. Execution is the scheduler's. */
export class BatchService {
  constructor(
    private readonly store: Store,
    private readonly files: FilesService,
    readonly scheduler: BatchScheduler | undefined,
    readonly signer: LinkSigner,
    private readonly windowSec: number,
    private readonly linkTtlSec: number,
  ) {}

  async create(orgId: string, keyId: string, b: NewBatch): Promise<BatchRecord> {
    if (!(BATCH_ENDPOINTS as readonly string[]).includes(b.endpoint))
      throw new InvalidValue(`endpoint must be one of ${BATCH_ENDPOINTS.join(', ')}`, 'endpoint')
    if (b.completionWindow !== '24h')
      throw new InvalidValue('completion_window must be "24h"', 'completion_window')
    const file = await this.files.get(orgId, b.inputFileId).catch(() => {
      throw new NotFound(`no file ${quoted(b.inputFileId)}`, 'file_not_found', 'input_file_id')
    })
    if (file.purpose !== 'batch')
      throw new InvalidValue('the input file must have purpose "batch"', 'input_file_id')
    const now = Math.floor(Date.now() / 1000)
    const rec: BatchRecord = {
      id: `batch_${sortableId()}`,
      orgId,
      keyId,
      endpoint: b.endpoint,
      inputFileId: file.id,
      completionWindow: b.completionWindow,
      status: 'validating',
      outputFileId: null,
      errorFileId: null,
      errors: null,
      metadata: b.metadata ? JSON.stringify(b.metadata) : null,
      total: 0,
      completed: 0,
      failed: 0,
      costNano: 0n,
      createdAt: now,
      expiresAt: now + this.windowSec,
      inProgressAt: null,
      finalizingAt: null,
      completedAt: null,
      failedAt: null,
      expiredAt: null,
      cancellingAt: null,
      cancelledAt: null,
    }
    await this.store.insertBatch(rec)
    this.scheduler?.nudge()
    return rec
  }

  async get(orgId: string, id: string): Promise<BatchRecord> {
    const b = await this.store.getBatch(id)
    if (!b || b.orgId !== orgId) throw batchNotFound(id)
    return b
  }

  list(orgId: string, afterId: string | undefined, limit: number) {
    return this.store.listBatches(orgId, afterId, limit)
  }

  async cancel(orgId: string, id: string): Promise<BatchRecord> {
    const b = await this.get(orgId, id)
    if (b.status === 'cancelling' || b.status === 'cancelled') return b
    const now = Math.floor(Date.now() / 1000)
    const ok = await this.store.updateBatch(id, { status: 'cancelling', cancellingAt: now }, [
      'validating',
      'in_progress',
    ])
    if (!ok) throw new Conflict(`a batch that is ${b.status} cannot be cancelled`, 'batch_not_cancellable')
    this.scheduler?.nudge()
    return this.get(orgId, id)
  }

  /** The OpenAI batch object, plus signed download links and the cost so far. */
  view(b: BatchRecord, baseUrl: string) {
    const expires = Math.floor(Date.now() / 1000) + this.linkTtlSec
    const link = (fileId: string | null) =>
      fileId
        ? `${baseUrl}/v1/files/${fileId}/content?expires=${expires}&signature=${this.signer.sign(fileId, expires)}`
        : null
    return {
      id: b.id,
      object: 'batch' as const,
      endpoint: b.endpoint,
      errors: b.errors ? (JSON.parse(b.errors) as unknown) : null,
      input_file_id: b.inputFileId,
      completion_window: b.completionWindow,
      status: b.status,
      output_file_id: b.outputFileId,
      error_file_id: b.errorFileId,
      created_at: b.createdAt,
      in_progress_at: b.inProgressAt,
      expires_at: b.expiresAt,
      // 0: a claim given back by a version before claims were cleared to null.
      finalizing_at: b.finalizingAt || null,
      completed_at: b.completedAt,
      failed_at: b.failedAt,
      expired_at: b.expiredAt,
      cancelling_at: b.cancellingAt,
      cancelled_at: b.cancelledAt,
      request_counts: { total: b.total, completed: b.completed, failed: b.failed },
      metadata: b.metadata ? (JSON.parse(b.metadata) as Record<string, string>) : null,
      output_file_url: link(b.outputFileId),
      error_file_url: link(b.errorFileId),
      cost_rub: nanoToRubNumber(b.costNano),
    }
  }
}

export function requireOwner(orgId: string | undefined): string {
  if (!orgId) throw new PermissionDenied('files and batches belong to an organization: use an API key')
  return orgId
}
