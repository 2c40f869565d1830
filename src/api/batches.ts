import { type Static, Type as T } from '@sinclair/typebox'

export const CreateBatchBody = T.Object(
  {
    input_file_id: T.String({ minLength: 1 }),
    endpoint: T.String(),
    completion_window: T.String(),
    metadata: T.Optional(
      T.Union([T.Record(T.String(), T.String({ maxLength: 512 }), { maxProperties: 16 }), T.Null()]),
    ),
  },
  { additionalProperties: false },
)
export type CreateBatchBody = Static<typeof CreateBatchBody>
