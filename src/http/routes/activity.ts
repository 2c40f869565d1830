import { Elysia, t } from 'elysia'
import { InvalidValue } from '../../errors.ts'
import { contentDisposition } from '../../files/names.ts'
import type { Services } from '../../services.ts'
import type { ActivityQuery, LedgerEntry } from '../../storage/store.ts'
import { authenticate, ledgerReader } from '../auth.ts'
import { queryEnum, queryInt } from '../query.ts'
import { ACTIVITY_CSV_COLUMNS, activityCsvRecord, activityView } from '../views.ts'

// Query values are checked by queryInt/queryEnum (the error names the parameter).
const ActivityParams = t.Object(
  {
    key_id: t.Optional(t.String()),
    model: t.Optional(t.String()),
    outcome: t.Optional(t.String()),
    end_user: t.Optional(t.String()),
    from: t.Optional(t.String()),
    to: t.Optional(t.String()),
    limit: t.Optional(t.String()),
    after: t.Optional(t.String()),
    include_credits: t.Optional(t.String()),
    format: t.Optional(t.String()),
    org_id: t.Optional(t.String()),
  },
  { additionalProperties: false },
)

/** Rows an export reads per store query: its memory bound, whatever the range. */
const EXPORT_PAGE = 1000

/**
 * GET /v1/activity: the ledger, one row per billed request, newest first. The JSON list pages as
 * /v1/keys does (`after` = the last request id of the page before); `format=csv|jsonl` streams
 * every matching row, a page of the store at a time as the client reads.
 */
export const activityRoutes = (svc: Services) =>
  new Elysia().derive(authenticate(svc)).get(
    '/v1/activity',
    async ({ principal, query }) => {
      const scope = ledgerReader(svc, principal, query.org_id, query.key_id)
      const format = queryEnum(query.format, 'format', ['json', 'csv', 'jsonl'] as const) ?? 'json'
      const from = queryInt(query.from, 'from', 0)
      const to = queryInt(query.to, 'to', 0)
      if (from !== undefined && to !== undefined && from >= to)
        throw new InvalidValue('from must be before to', 'from')
      const includeCredits = queryEnum(query.include_credits, 'include_credits', ['true', 'false'] as const)
      if (format !== 'json' && query.limit !== undefined)
        throw new InvalidValue(
          'an export (format=csv or jsonl) has every matching row; limit is for the list',
          'limit',
        )
      const limit = queryInt(query.limit, 'limit', 1, 1000) ?? 100
      // Rows settled a moment ago wait in the ledger's queue: a read right after a request sees them.
      await svc.ledger.flush()
      let before: ActivityQuery['before']
      if (query.after !== undefined) {
        const row = await svc.store.ledgerEntry(scope.org.id, query.after)
        if (!row || (scope.keyId !== undefined && row.keyId !== scope.keyId))
          throw new InvalidValue('after must be the request_id of a row of this list (its last_id)', 'after')
        before = { endedAtMs: row.endedAtMs, requestId: row.requestId }
      }
      const q: ActivityQuery = {
        orgId: scope.org.id,
        keyId: scope.keyId,
        model: query.model,
        outcome: query.outcome,
        endUser: query.end_user,
        fromMs: from === undefined ? undefined : from * 1000,
        toMs: to === undefined ? undefined : to * 1000,
        includeCredits: includeCredits === 'true',
        before,
        limit,
      }
      const keyName = (e: LedgerEntry) =>
        e.keyId === null ? null : (svc.identity.keyById(e.keyId)?.name ?? null)
      if (format === 'json') {
        const rows = await svc.store.listActivity({ ...q, limit: limit + 1 })
        const data = rows.slice(0, limit).map((e) => activityView(e, keyName(e)))
        return {
          object: 'list',
          data,
          has_more: rows.length > limit,
          first_id: data[0]?.request_id ?? null,
          last_id: data.at(-1)?.request_id ?? null,
        }
      }
      const csv = format === 'csv'
      const encoder = new TextEncoder()
      let cursor = before
      let headed = !csv
      let done = false
      // Pulled as the client reads: one store page per pull, so a slow client holds one page.
      const body = new ReadableStream<Uint8Array>({
        async pull(controller) {
          if (done) return
          let text = headed ? '' : `${ACTIVITY_CSV_COLUMNS.join(',')}\r\n`
          headed = true
          const rows = await svc.store.listActivity({ ...q, before: cursor, limit: EXPORT_PAGE })
          // JSONL carries each row's receipt, signed again (in the receipt thread) with its key.
          const receipts = !csv && svc.deps.receipts ? await svc.deps.receipts.signRows(rows) : undefined
          for (let i = 0; i < rows.length; i++) {
            const e = rows[i]!
            text += csv
              ? activityCsvRecord(e, keyName(e))
              : `${JSON.stringify(receipts ? { ...activityView(e, keyName(e)), receipt: receipts[i] ?? null } : activityView(e, keyName(e)))}\n`
          }
          const last = rows.at(-1)
          if (last) cursor = { endedAtMs: last.endedAtMs, requestId: last.requestId }
          if (text.length > 0) controller.enqueue(encoder.encode(text))
          if (rows.length < EXPORT_PAGE) {
            done = true
            controller.close()
          }
        },
        cancel() {
          done = true
        },
      })
      const range = `${from ?? 'start'}-${to ?? 'now'}`
      return new Response(body, {
        headers: {
          'content-type': csv
            ? 'text/csv; charset=utf-8; header=present'
            : 'application/jsonl; charset=utf-8',
          'content-disposition': contentDisposition(`activity-${scope.org.id}-${range}.${format}`),
          'cache-control': 'no-store',
        },
      })
    },
    {
      query: ActivityParams,
      detail: {
        tags: ['usage'],
        summary:
          'The ledger: one row per billed request, newest first, filtered and paged; format=csv or jsonl exports',
      },
    },
  )
