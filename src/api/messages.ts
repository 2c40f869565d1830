import { type Static, Type as T } from '@sinclair/typebox'

// The Anthropic Messages API surface as Tropa checks it (POST /v1/messages and
// /v1/messages/count_tokens). Objects allow extra properties (cache_control, citations, ...):
// what Tropa cannot translate is dropped, as docs/api.md lists; block types it cannot carry to
// an OpenAI-form request fail the schema with a 400 naming them.
const open = { additionalProperties: true } as const

export const MsgTextBlock = T.Object({ type: T.Literal('text'), text: T.String() }, open)
export const MsgImageBlock = T.Object(
  {
    type: T.Literal('image'),
    source: T.Union([
      T.Object(
        {
          type: T.Literal('base64'),
          media_type: T.String({ minLength: 1, maxLength: 100 }),
          data: T.String({ minLength: 1 }),
        },
        open,
      ),
      T.Object({ type: T.Literal('url'), url: T.String({ minLength: 1 }) }, open),
    ]),
  },
  open,
)
export const MsgToolUseBlock = T.Object(
  {
    type: T.Literal('tool_use'),
    id: T.String({ minLength: 1 }),
    name: T.String({ minLength: 1 }),
    input: T.Unknown(),
  },
  open,
)
export const MsgToolResultBlock = T.Object(
  {
    type: T.Literal('tool_result'),
    tool_use_id: T.String({ minLength: 1 }),
    content: T.Optional(T.Union([T.String(), T.Array(T.Union([MsgTextBlock, MsgImageBlock]))])),
    is_error: T.Optional(T.Boolean()),
  },
  open,
)
/** The model's own reasoning, sent back by clients that got it: dropped (no OpenAI form). */
export const MsgThinkingBlock = T.Object(
  { type: T.Union([T.Literal('thinking'), T.Literal('redacted_thinking')]) },
  open,
)
export const MsgContentBlock = T.Union([
  MsgTextBlock,
  MsgImageBlock,
  MsgToolUseBlock,
  MsgToolResultBlock,
  MsgThinkingBlock,
])
export type MsgContentBlock = Static<typeof MsgContentBlock>

export const MsgMessage = T.Object(
  {
    role: T.Union([T.Literal('user'), T.Literal('assistant')]),
    content: T.Union([T.String(), T.Array(MsgContentBlock)]),
  },
  open,
)
export type MsgMessage = Static<typeof MsgMessage>

export const MsgCustomTool = T.Object(
  {
    type: T.Optional(T.Literal('custom')),
    name: T.String({ minLength: 1, maxLength: 64 }),
    description: T.Optional(T.String()),
    input_schema: T.Object({}, open),
  },
  open,
)
/**
 * One of Anthropic's server tools (`web_search_20250305`, `code_execution_…`, `bash_…`): run by
 * Anthropic, not by the model behind Tropa, so it is dropped (Claude Code sends some).
 */
export const MsgServerTool = T.Object(
  { type: T.String({ minLength: 1, maxLength: 100 }), name: T.String({ minLength: 1, maxLength: 64 }) },
  open,
)
export const MsgTool = T.Union([MsgCustomTool, MsgServerTool])

const parallel = { disable_parallel_tool_use: T.Optional(T.Boolean()) }
export const MsgToolChoice = T.Union([
  T.Object({ type: T.Literal('auto'), ...parallel }, open),
  T.Object({ type: T.Literal('any'), ...parallel }, open),
  T.Object({ type: T.Literal('none') }, open),
  T.Object({ type: T.Literal('tool'), name: T.String({ minLength: 1 }), ...parallel }, open),
])

/** What both endpoints read of a request: the prompt. */
const promptFields = {
  model: T.String({ minLength: 1 }),
  messages: T.Array(MsgMessage, { minItems: 1 }),
  system: T.Optional(T.Union([T.String(), T.Array(MsgTextBlock)])),
  tools: T.Optional(T.Array(MsgTool)),
  tool_choice: T.Optional(MsgToolChoice),
}

export const MessagesRequest = T.Object(
  {
    ...promptFields,
    max_tokens: T.Integer({ minimum: 1 }),
    stream: T.Optional(T.Boolean()),
    stop_sequences: T.Optional(T.Array(T.String({ minLength: 1 }))),
    temperature: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
    top_p: T.Optional(T.Number({ minimum: 0, maximum: 1 })),
    top_k: T.Optional(T.Integer({ minimum: 0 })),
    metadata: T.Optional(T.Object({ user_id: T.Optional(T.Union([T.String(), T.Null()])) }, open)),
  },
  open,
)
export type MessagesRequest = Static<typeof MessagesRequest>

export const CountTokensRequest = T.Object(promptFields, open)
export type CountTokensRequest = Static<typeof CountTokensRequest>
