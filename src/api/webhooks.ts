import { type Static, Type as T } from '@sinclair/typebox'
import { WEBHOOK_EVENT_TYPES } from '../webhooks/event-types.ts'
import { MAX_URL_LENGTH } from '../webhooks/urls.ts'

const Url = T.String({ minLength: 1, maxLength: MAX_URL_LENGTH, description: 'an http or https URL' })
const Events = T.Array(T.Union(WEBHOOK_EVENT_TYPES.map((e) => T.Literal(e))), {
  minItems: 1,
  maxItems: WEBHOOK_EVENT_TYPES.length * 2,
})
/** balance.below_threshold is sent when the balance drops below this; null: not set. */
const Threshold = T.Union([
  T.Number({ minimum: 0, description: 'roubles, at most six fractional digits' }),
  T.Null(),
])

export const CreateWebhookBody = T.Object(
  {
    url: Url,
    events: Events,
    balance_threshold_rub: T.Optional(Threshold),
    enabled: T.Optional(T.Boolean()),
    /** Only with the admin token: the organization the webhook belongs to. */
    org_id: T.Optional(T.String()),
  },
  { additionalProperties: false },
)
export type CreateWebhookBody = Static<typeof CreateWebhookBody>

export const PatchWebhookBody = T.Object(
  {
    url: T.Optional(Url),
    events: T.Optional(Events),
    balance_threshold_rub: T.Optional(Threshold),
    enabled: T.Optional(T.Boolean()),
  },
  { additionalProperties: false },
)
export type PatchWebhookBody = Static<typeof PatchWebhookBody>
