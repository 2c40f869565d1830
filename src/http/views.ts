import type { Budget } from '../billing/budgets.ts'
import type { BudgetNow } from '../billing/meter.ts'
import { formatRub, type NanoRub, nanoToRubNumber } from '../billing/money.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { LedgerEntry } from '../storage/store.ts'

const budgetView = (b: Budget) => ({
  amount_rub: nanoToRubNumber(b.amountNano),
  period: b.period,
  timezone: b.timezone,
})

/**
 * A key as `/v1/keys` shows it: never the secret, only its hint. `now` is where its period budget
 * stands (IdentityService.budgetNow): spent in the current period, and when it resets.
 */
export function keyView(k: LiveKey, now?: BudgetNow) {
  return {
    key_id: k.id,
    object: 'key' as const,
    name: k.name,
    key_hint: k.hint,
    limit_rub: k.limitNano === null ? null : nanoToRubNumber(k.limitNano),
    spent_rub: nanoToRubNumber(k.spentNano),
    // An active key past its expires_at is refused (401 key_expired) and listed as expired.
    status: k.status === 'active' && k.expired(Date.now() / 1000) ? ('expired' as const) : k.status,
    created_at: k.createdAt,
    last_used_at: k.lastUsedAt,
    revoked_at: k.revokedAt,
    rpm_limit: k.rpmLimit,
    tpm_limit: k.tpmLimit,
    expires_at: k.expiresAt,
    models: k.models,
    max_concurrency: k.maxConcurrency,
    budget: k.budget && {
      ...budgetView(k.budget),
      // Settled charges of requests admitted in the current period, and holds of those in flight.
      spent_rub: now ? nanoToRubNumber(now.committedNano - now.reservedNano) : 0,
      reserved_rub: now ? nanoToRubNumber(now.reservedNano) : 0,
      period_start: now ? Math.floor(now.span.startMs / 1000) : null,
      resets_at: now ? Math.ceil(now.span.endMs / 1000) : null,
    },
    end_user_budget: k.endUserBudget && budgetView(k.endUserBudget),
  }
}

/** An organization; `now` is where its money stands (IdentityService.orgNow), by default its live copy. */
export function orgView(o: LiveOrg, now: { balanceNano: NanoRub; reservedNano: NanoRub } = o) {
  return {
    id: o.id,
    object: 'organization' as const,
    name: o.name,
    balance_rub: nanoToRubNumber(now.balanceNano),
    reserved_rub: nanoToRubNumber(now.reservedNano),
    created_at: o.createdAt,
    rpm_limit: o.rpmLimit,
    tpm_limit: o.tpmLimit,
    model_limits: o.modelLimits,
  }
}

/** A ledger row as GET /v1/activity shows it (the JSON list and JSONL export; CSV has its columns). */
export function activityView(e: LedgerEntry, keyName: string | null) {
  return {
    object: 'activity' as const,
    request_id: e.requestId,
    created_at: Math.floor(e.endedAtMs / 1000),
    kind: e.kind,
    key_id: e.keyId,
    key_name: keyName,
    model: e.model,
    node: e.node,
    batch_id: e.batchId,
    outcome: e.outcome,
    prompt_tokens: e.promptTokens,
    completion_tokens: e.completionTokens,
    cached_tokens: e.cachedTokens ?? null,
    total_tokens: e.promptTokens + e.completionTokens,
    cost_rub: nanoToRubNumber(e.costNano),
    estimated: e.estimated,
    started_at_ms: e.startedAtMs,
    ended_at_ms: e.endedAtMs,
    duration_ms: e.endedAtMs - e.startedAtMs,
    ttft_ms: e.ttftMs ?? null,
    /** Credits and debits: the operator's reason, if one was given. */
    reason: e.reason ?? null,
    end_user: e.endUser ?? null,
  }
}

/** The CSV export's columns: activityView's fields but `object`, with cost_rub as exact text. */
export const ACTIVITY_CSV_COLUMNS = [
  'request_id',
  'created_at',
  'kind',
  'key_id',
  'key_name',
  'model',
  'node',
  'batch_id',
  'outcome',
  'prompt_tokens',
  'completion_tokens',
  'cached_tokens',
  'total_tokens',
  'cost_rub',
  'estimated',
  'started_at_ms',
  'ended_at_ms',
  'duration_ms',
  'ttft_ms',
  'reason',
  'end_user',
] as const

/** One CSV field per RFC 4180: quoted (quotes doubled) when it holds a comma, quote, CR or LF; null is empty. */
export function csvField(v: string | number | boolean | null): string {
  if (v === null) return ''
  const s = String(v)
  return /[",\r\n]/.test(s) ? `"${s.replaceAll('"', '""')}"` : s
}

/** A CSV record of a row (CRLF-terminated, as RFC 4180 has it). */
export function activityCsvRecord(e: LedgerEntry, keyName: string | null): string {
  const v = activityView(e, keyName)
  const fields = ACTIVITY_CSV_COLUMNS.map((c) =>
    c === 'cost_rub' ? formatRub(e.costNano) : csvField(v[c] as string | number | boolean | null),
  )
  return `${fields.join(',')}\r\n`
}
