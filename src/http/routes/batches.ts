import { TypeCompiler } from '@sinclair/typebox/compiler'
import { Elysia, t } from 'elysia'
import { CreateBatchBody } from '../../api/batches.ts'
import { fromValueError } from '../../api/value-error.ts'
import { listenUrl } from '../../config/load.ts'
import { InvalidValue } from '../../errors.ts'
import type { Services } from '../../services.ts'
import type { BatchRecord } from '../../storage/store.ts'
import { authenticate, payerOf } from '../auth.ts'
import { jsonRequestBody, readJson } from '../body.ts'
import { queryInt } from '../query.ts'

const Params = t.Object({ batch_id: t.String() })
const FINAL = new Set(['completed', 'failed', 'expired', 'cancelled'])

/** The Batch API (API keys). POST takes OpenAI's JSON body, or a multipart form with the file inline. */
export const batchRoutes = (svc: Services) => {
  const tags = ['batches']
  const check = TypeCompiler.Compile(CreateBatchBody)
  // Download links start at server.public_url, or else at the address Tropa listens on: never at
  // the request's Host header, which the client writes (a forged one would send the link's
  // holder, signature and all, to another host).
  const base = (server: { port?: number | undefined } | null) =>
    svc.config.server.publicUrl ?? listenUrl(svc.config.server.host, server?.port ?? svc.config.server.port)
  // The cost of a running batch is the sum of its ledger rows so far.
  const withCost = async (b: BatchRecord) =>
    FINAL.has(b.status) ? b : { ...b, costNano: await svc.store.batchCostNano(b.id) }
  return new Elysia()
    .derive(authenticate(svc))
    .post(
      '/v1/batches',
      async ({ principal, request, server }) => {
        const payer = payerOf(principal)
        let body: unknown
        if ((request.headers.get('content-type') ?? '').toLowerCase().startsWith('multipart/form-data')) {
          const { file, fields } = await svc.files.uploadForm(payer.org.id, request)
          let metadata: unknown = null
          try {
            metadata = fields.metadata ? JSON.parse(fields.metadata) : null
          } catch {
            throw new InvalidValue('metadata must be a JSON object', 'metadata')
          }
          body = {
            input_file_id: file.id,
            endpoint: fields.endpoint,
            completion_window: fields.completion_window ?? '24h',
            metadata,
          }
        } else body = await readJson(request, 64 * 1024)
        if (!check.Check(body)) throw fromValueError(check.Errors(body).First())
        const b = await svc.batches.create(payer.org.id, payer.key.id, {
          inputFileId: body.input_file_id,
          endpoint: body.endpoint,
          completionWindow: body.completion_window,
          metadata: body.metadata ?? null,
        })
        return svc.batches.view(b, base(server))
      },
      {
        parse: 'none',
        detail: {
          tags,
          summary: 'Create a batch from an uploaded JSONL file (or inline multipart)',
          requestBody: jsonRequestBody(CreateBatchBody),
        },
      },
    )
    .get(
      '/v1/batches',
      async ({ principal, query, server }) => {
        const payer = payerOf(principal)
        const limit = queryInt(query.limit, 'limit', 1, 100) ?? 20
        const rows = await svc.batches.list(payer.org.id, query.after, limit + 1)
        const data = await Promise.all(
          rows.slice(0, limit).map(async (b) => svc.batches.view(await withCost(b), base(server))),
        )
        return {
          object: 'list',
          data,
          has_more: rows.length > limit,
          first_id: data[0]?.id ?? null,
          last_id: data.at(-1)?.id ?? null,
        }
      },
      {
        query: t.Object({ limit: t.Optional(t.String()), after: t.Optional(t.String()) }),
        detail: { tags, summary: 'List batches, newest first' },
      },
    )
    .get(
      '/v1/batches/:batch_id',
      async ({ principal, params, server }) =>
        svc.batches.view(
          await withCost(await svc.batches.get(payerOf(principal).org.id, params.batch_id)),
          base(server),
        ),
      {
        params: Params,
        detail: { tags, summary: 'A batch: status, request_counts, result files and signed links' },
      },
    )
    .post(
      '/v1/batches/:batch_id/cancel',
      async ({ principal, params, server }) =>
        svc.batches.view(await svc.batches.cancel(payerOf(principal).org.id, params.batch_id), base(server)),
      { params: Params, parse: 'none', detail: { tags, summary: 'Cancel: finished lines are delivered' } },
    )
}
