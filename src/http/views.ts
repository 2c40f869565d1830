import { nanoToRubNumber } from '../billing/money.ts'
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

export function orgView(o: LiveOrg) {
  return {
    id: o.id,
    object: 'organization' as const,
    name: o.name,
    balance_rub: nanoToRubNumber(o.balanceNano),
    reserved_rub: nanoToRubNumber(o.reservedNano),
    created_at: o.createdAt,
  }
}
