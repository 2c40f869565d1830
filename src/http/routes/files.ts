import { Elysia, t } from 'elysia'
import { PermissionDenied } from '../../errors.ts'
import { contentDisposition } from '../../files/names.ts'
import { fileView } from '../../files/service.ts'
import type { Services } from '../../services.ts'
import { authenticate, credentialOf, payerOf } from '../auth.ts'
import { queryInt } from '../query.ts'

const Params = t.Object({ file_id: t.String() })

/** Files of an organization (API keys). Content may also be fetched with a signed link. */
export const fileRoutes = (svc: Services) => {
  const tags = ['files']
  const files = svc.files
  return (
    new Elysia()
      // Signed download links work without the Authorization header, so this route
      // authenticates itself.
      .get(
        '/v1/files/:file_id/content',
        async ({ params, query, request }) => {
          let file: Awaited<ReturnType<typeof files.getAny>>
          if (query.signature !== undefined || query.expires !== undefined) {
            if (!svc.batches.signer.verify(params.file_id, Number(query.expires), query.signature ?? ''))
              throw new PermissionDenied('the download link is invalid or has expired')
            file = await files.getAny(params.file_id)
          } else {
            const payer = payerOf(await svc.identity.authenticateShared(credentialOf(request)))
            file = await files.get(payer.org.id, params.file_id)
          }
          return new Response(files.contents.stream(file.id), {
            headers: {
              'content-type': 'application/jsonl',
              'content-disposition': contentDisposition(file.filename),
            },
          })
        },
        {
          params: Params,
          query: t.Object({ expires: t.Optional(t.String()), signature: t.Optional(t.String()) }),
          detail: { tags, summary: 'File content (Authorization, or a signed link from a batch)' },
        },
      )
      .derive(authenticate(svc))
      .post(
        '/v1/files',
        async ({ principal, request, set }) => {
          const payer = payerOf(principal)
          const file = await files.upload(payer.org.id, request)
          set.status = 200
          return fileView(file)
        },
        { parse: 'none', detail: { tags, summary: 'Upload a JSONL file (multipart: file, purpose=batch)' } },
      )
      .get(
        '/v1/files',
        async ({ principal, query }) => {
          const payer = payerOf(principal)
          const limit = queryInt(query.limit, 'limit', 1, 10_000) ?? 100
          const rows = await files.list(payer.org.id, query.after, limit + 1)
          const data = rows.slice(0, limit).map(fileView)
          return {
            object: 'list',
            data,
            has_more: rows.length > limit,
            first_id: data[0]?.id ?? null,
            last_id: data.at(-1)?.id ?? null,
          }
        },
        {
          query: t.Object({
            limit: t.Optional(t.String()),
            after: t.Optional(t.String()),
            purpose: t.Optional(t.String()),
          }),
          detail: { tags, summary: 'List files, newest first' },
        },
      )
      .get(
        '/v1/files/:file_id',
        async ({ principal, params }) => fileView(await files.get(payerOf(principal).org.id, params.file_id)),
        {
          params: Params,
          detail: { tags, summary: 'One file' },
        },
      )
      .delete(
        '/v1/files/:file_id',
        async ({ principal, params }) => {
          await files.remove(payerOf(principal).org.id, params.file_id)
          return { id: params.file_id, object: 'file', deleted: true }
        },
        { params: Params, detail: { tags, summary: 'Delete a file' } },
      )
  )
}
