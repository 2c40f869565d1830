import { type NanoRub, nanoToRubNumber } from '../billing/money.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'

/** A key as `/v1/keys` shows it: never the secret, only its hint. */
export function keyView(k: LiveKey) {
  return {
    key_id: k.id,
    object: 'key' as const,
    name: k.name,
    key_hint: k.hint,
    limit_rub: k.limitNano === null ? null : nanoToRubNumber(k.limitNano),
    spent_rub: nanoToRubNumber(k.spentNano),
    status: k.status,
    created_at: k.createdAt,
    last_used_at: k.lastUsedAt,
    revoked_at: k.revokedAt,
    rpm_limit: k.rpmLimit,
    tpm_limit: k.tpmLimit,
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
  }
}
