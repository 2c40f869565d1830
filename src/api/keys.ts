import { type Static, Type as T } from '@sinclair/typebox'

const Rub = T.Number({ minimum: 0, description: 'roubles, at most six fractional digits' })
const PerMinute = T.Union([T.Integer({ minimum: 1 }), T.Null()])
/** Unix seconds after which the key is refused (401 key_expired); null: never. */
const ExpiresAt = T.Union([T.Integer({ minimum: 0, maximum: 32_503_680_000 }), T.Null()])
/** Catalogue model ids or patterns (`*` matches any characters, as in `anthropic/*`); null: every model. */
const KeyModels = T.Union([
  T.Array(T.String({ minLength: 1, maxLength: 256, pattern: '^[A-Za-z0-9._:/*-]+$' }), { maxItems: 256 }),
  T.Null(),
])

/** Requests of the key in flight at once across the cluster (429 key_concurrency_exceeded past it); null: no bound. */
const MaxConcurrency = T.Union([T.Integer({ minimum: 1, maximum: 1_000_000 }), T.Null()])

/**
 * An organization's per-model limits: by catalogue model id or pattern (`*` matches any
 * characters), requests and tokens per minute; null: none.
 */
const ModelLimitsBody = T.Union([
  T.Record(
    T.String({ pattern: '^[A-Za-z0-9._:/*-]{1,256}$' }),
    T.Object({ rpm: T.Optional(PerMinute), tpm: T.Optional(PerMinute) }, { additionalProperties: false }),
    { maxProperties: 256, additionalProperties: false },
  ),
  T.Null(),
])
/**
 * A budget that resets every period: `amount_rub` per `period` (day, week from Monday, month),
 * periods in `timezone` (an IANA name; default UTC). null clears it.
 */
const BudgetBody = T.Union([
  T.Object(
    {
      amount_rub: Rub,
      period: T.Union([T.Literal('day'), T.Literal('week'), T.Literal('month')]),
      timezone: T.Optional(T.String({ minLength: 1, maxLength: 64 })),
    },
    { additionalProperties: false },
  ),
  T.Null(),
])
export type BudgetBody = Static<typeof BudgetBody>

export const CreateKeyBody = T.Object(
  {
    name: T.String({ minLength: 1, maxLength: 128 }),
    limit_rub: T.Optional(T.Union([Rub, T.Null()])),
    rpm_limit: T.Optional(PerMinute),
    tpm_limit: T.Optional(PerMinute),
    expires_at: T.Optional(ExpiresAt),
    models: T.Optional(KeyModels),
    max_concurrency: T.Optional(MaxConcurrency),
    budget: T.Optional(BudgetBody),
    end_user_budget: T.Optional(BudgetBody),
    /** Only with the admin token: the organization to create the key in. */
    org_id: T.Optional(T.String()),
  },
  { additionalProperties: false },
)
export type CreateKeyBody = Static<typeof CreateKeyBody>

export const PatchKeyBody = T.Object(
  {
    name: T.Optional(T.String({ minLength: 1, maxLength: 128 })),
    limit_rub: T.Optional(T.Union([Rub, T.Null()])),
    disabled: T.Optional(T.Boolean()),
    rpm_limit: T.Optional(PerMinute),
    tpm_limit: T.Optional(PerMinute),
    expires_at: T.Optional(ExpiresAt),
    models: T.Optional(KeyModels),
    max_concurrency: T.Optional(MaxConcurrency),
    budget: T.Optional(BudgetBody),
    end_user_budget: T.Optional(BudgetBody),
  },
  { additionalProperties: false },
)
export type PatchKeyBody = Static<typeof PatchKeyBody>

export const CreateOrgBody = T.Object(
  {
    name: T.String({ minLength: 1, maxLength: 128 }),
    balance_rub: T.Optional(Rub),
    rpm_limit: T.Optional(PerMinute),
    tpm_limit: T.Optional(PerMinute),
    model_limits: T.Optional(ModelLimitsBody),
  },
  { additionalProperties: false },
)
export type CreateOrgBody = Static<typeof CreateOrgBody>

/** Why an operator credits or debits: kept in the ledger beside the row (ledger_notes). */
const Reason = T.String({ minLength: 1, maxLength: 500 })
/** PATCH /v1/admin/organizations/{id}: the rate limits; an absent field stays, null clears it. */
export const PatchOrgBody = T.Object(
  {
    rpm_limit: T.Optional(PerMinute),
    tpm_limit: T.Optional(PerMinute),
    model_limits: T.Optional(ModelLimitsBody),
  },
  { additionalProperties: false },
)
export type PatchOrgBody = Static<typeof PatchOrgBody>

export const CreditBody = T.Object(
  { amount_rub: T.Number({ exclusiveMinimum: 0 }), reason: T.Optional(Reason) },
  { additionalProperties: false },
)
export type CreditBody = Static<typeof CreditBody>

/** A debit says why. */
export const DebitBody = T.Object(
  { amount_rub: T.Number({ exclusiveMinimum: 0 }), reason: Reason },
  { additionalProperties: false },
)
export type DebitBody = Static<typeof DebitBody>

export const MasterKeyBody = T.Object(
  { name: T.String({ minLength: 1, maxLength: 128 }) },
  { additionalProperties: false },
)
export type MasterKeyBody = Static<typeof MasterKeyBody>
