import { type Static, Type as T } from '@sinclair/typebox'

// The legacy completions surface (POST /v1/completions) as Tropa checks it. A model whose routes
// are all OpenAI-compatible gets the request passed through (unknown fields too); any other gets
// it translated to chat, where the fields chat cannot carry (suffix, echo, logprobs, several
// prompts or choices, token arrays) are refused with a clear 400 by pipeline/completions.ts and
// unknown fields are dropped (docs/api.md).
const open = { additionalProperties: true } as const
const nullable = <S extends Parameters<typeof T.Union>[0][number]>(s: S) => T.Optional(T.Union([s, T.Null()]))

export const CompletionRequest = T.Object(
  {
    model: T.String({ minLength: 1 }),
    prompt: T.Union([
      T.String(),
      // Texts, token ids (one prompt), or arrays of token ids (one prompt each).
      T.Array(T.Union([T.String(), T.Integer(), T.Array(T.Integer())]), { minItems: 1 }),
    ]),
    max_tokens: nullable(T.Integer({ minimum: 1 })),
    temperature: nullable(T.Number({ minimum: 0, maximum: 2 })),
    top_p: nullable(T.Number({ minimum: 0, maximum: 1 })),
    n: nullable(T.Integer({ minimum: 1, maximum: 128 })),
    best_of: nullable(T.Integer({ minimum: 0, maximum: 20 })),
    stream: nullable(T.Boolean()),
    stream_options: nullable(T.Object({ include_usage: T.Optional(T.Boolean()) }, open)),
    stop: nullable(T.Union([T.String(), T.Array(T.String(), { maxItems: 4 })])),
    presence_penalty: nullable(T.Number({ minimum: -2, maximum: 2 })),
    frequency_penalty: nullable(T.Number({ minimum: -2, maximum: 2 })),
    seed: nullable(T.Integer()),
    logit_bias: nullable(T.Record(T.String(), T.Number())),
    suffix: nullable(T.String()),
    echo: nullable(T.Boolean()),
    logprobs: nullable(T.Integer({ minimum: 0, maximum: 5 })),
    user: T.Optional(T.String()),
  },
  open,
)
export type CompletionRequest = Static<typeof CompletionRequest>
