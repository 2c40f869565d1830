import { type Static, Type as T } from '@sinclair/typebox'

export const MAX_EMBEDDING_INPUTS = 2048

export const EmbeddingRequest = T.Object(
  {
    model: T.String({ minLength: 1 }),
    // Sizes (empty, more than 2048) are checked in the pipeline so they get their own codes.
    input: T.Union([
      T.String(),
      T.Array(T.String()),
      T.Array(T.Integer({ minimum: 0 })),
      T.Array(T.Array(T.Integer({ minimum: 0 }))),
    ]),
    dimensions: T.Optional(T.Integer({ minimum: 1 })),
    encoding_format: T.Optional(T.Union([T.Literal('float'), T.Literal('base64')])),
    user: T.Optional(T.String()),
  },
  { additionalProperties: true },
)
export type EmbeddingRequest = Static<typeof EmbeddingRequest>
