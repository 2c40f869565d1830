import type { UsageHour } from './ledger-rows.ts'
import type { UsageHoursQuery } from './store.ts'

// The usage series' tables, in SQL text that both stores run (placeholders `?1` in SQLite, `$1`
// in PostgreSQL): usage_hours per organization, hour, key and model, and its sums over every key
// (usage_hours_by_model) and over every model (usage_hours_by_key). A series by model over 30 days
// reads 720 rows per model from the second instead of one per key and model from the first.

type Placeholder = (n: number) => string
export const sqlitePlaceholder: Placeholder = (n) => `?${n}`
export const pgPlaceholder: Placeholder = (n) => `$${n}`

const SUMS = ['requests', 'prompt_tokens', 'completion_tokens', 'cached_tokens', 'cost_nano'] as const

/** The three tables a ledger write adds its hours to, and the columns after org_id and hour_start. */
export const HOUR_TABLES = {
  hours: { table: 'usage_hours', by: ['key_id', 'model'] },
  byModel: { table: 'usage_hours_by_model', by: ['model'] },
  byKey: { table: 'usage_hours_by_key', by: ['key_id'] },
} as const
export type HourTable = keyof typeof HOUR_TABLES

/** Adds a flush's sums to an hour of a table (cost_nano is cast for PostgreSQL's text parameter). */
export function hourUpsert(which: HourTable, ph: Placeholder, costCast = ''): string {
  const { table, by } = HOUR_TABLES[which]
  const cols = ['org_id', 'hour_start', ...by, ...SUMS]
  const values = cols.map((c, i) => (c === 'cost_nano' ? `${ph(i + 1)}${costCast}` : ph(i + 1)))
  return `INSERT INTO ${table} (${cols.join(', ')}) VALUES (${values.join(', ')})
  ON CONFLICT (${['org_id', 'hour_start', ...by].join(', ')}) DO UPDATE SET
    ${SUMS.map((c) => `${c} = ${table}.${c} + excluded.${c}`).join(',\n    ')}`
}

/** The parameters of hourUpsert for an hour (the cost as text for PostgreSQL, bigint for SQLite). */
export function hourParams(which: HourTable, h: UsageHour, costAsText = false): (string | number | bigint)[] {
  const by = which === 'hours' ? [h.keyId, h.model] : which === 'byModel' ? [h.model] : [h.keyId]
  return [
    h.orgId,
    h.hourStart,
    ...by,
    h.requests,
    h.promptTokens,
    h.completionTokens,
    h.cachedTokens,
    costAsText ? h.costNano.toString() : h.costNano,
  ]
}

/**
 * The query of a usage series: from the sums per model when no key is asked for and the series is
 * per model or a total, from those per key when no model is asked for and it is per key or a total,
 * else from the hours of each key and model. Rows: hour_start, grp ('' for none), the five sums.
 */
export function usageHoursQuery(
  q: UsageHoursQuery,
  ph: Placeholder,
): { text: string; params: (string | number)[] } {
  const which: HourTable =
    q.keyId === undefined && q.groupBy !== 'key'
      ? 'byModel'
      : q.model === undefined && q.groupBy !== 'model'
        ? 'byKey'
        : 'hours'
  const params: (string | number)[] = [q.orgId, q.fromSec, q.toSec]
  const where = [`org_id = ${ph(1)}`, `hour_start >= ${ph(2)}`, `hour_start < ${ph(3)}`]
  if (q.keyId !== undefined) {
    params.push(q.keyId)
    where.push(`key_id = ${ph(params.length)}`)
  }
  if (q.model !== undefined) {
    params.push(q.model)
    where.push(`model = ${ph(params.length)}`)
  }
  const group = q.groupBy === 'model' ? 'model' : q.groupBy === 'key' ? 'key_id' : undefined
  const by = group ? `hour_start, ${group}` : 'hour_start'
  const text = `SELECT hour_start, ${group ?? "''"} AS grp, ${SUMS.map((c) => `sum(${c}) AS ${c}`).join(', ')}
  FROM ${HOUR_TABLES[which].table} WHERE ${where.join(' AND ')} GROUP BY ${by} ORDER BY ${by}`
  return { text, params }
}

type SqlValue = bigint | string | number | null
/** A row of usageHoursQuery as either driver returns it (bigint, number or numeric text). */
export interface HourSumRow {
  readonly hour_start: SqlValue
  readonly grp: SqlValue
  readonly requests: SqlValue
  readonly prompt_tokens: SqlValue
  readonly completion_tokens: SqlValue
  readonly cached_tokens: SqlValue
  readonly cost_nano: SqlValue
}
