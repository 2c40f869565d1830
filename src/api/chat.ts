import { type Static, Type as T } from '@sinclair/typebox'

// The OpenAI chat surface as Tropa checks it. Objects allow extra properties: unknown fields
// pass through to OpenAI-compatible upstreams untouched (decisions.md, Chat completions).
const open = { additionalProperties: true } as const

export const TextPart = T.Object({ type: T.Literal('text'), text: T.String() }, open)
export const ImagePart = T.Object(
  {
    type: T.Literal('image_url'),
    image_url: T.Object(
      {
        url: T.String({ minLength: 1 }),
        detail: T.Optional(T.Union([T.Literal('auto'), T.Literal('low'), T.Literal('high')])),
      },
      open,
    ),
  },
  open,
)
export const AudioPart = T.Object(
  { type: T.Literal('input_audio'), input_audio: T.Object({ data: T.String(), format: T.String() }, open) },
  open,
)
export const FilePart = T.Object({ type: T.Literal('file'), file: T.Object({}, open) }, open)
export const ContentPart = T.Union([
  TextPart,
  ImagePart,
  AudioPart,
  FilePart,
  T.Object({ type: T.Literal('refusal'), refusal: T.String() }, open),
])
export type ContentPart = Static<typeof ContentPart>

export const ToolCall = T.Object(
  {
    id: T.String(),
    type: T.Literal('function'),
    function: T.Object({ name: T.String(), arguments: T.String() }, open),
  },
  open,
)

export const ChatMessage = T.Object(
  {
    role: T.Union([
      T.Literal('system'),
      T.Literal('developer'),
      T.Literal('user'),
      T.Literal('assistant'),
      T.Literal('tool'),
    ]),
    content: T.Optional(T.Union([T.String(), T.Array(ContentPart), T.Null()])),
    name: T.Optional(T.String()),
    tool_calls: T.Optional(T.Array(ToolCall)),
    tool_call_id: T.Optional(T.String()),
  },
  open,
)
export type ChatMessage = Static<typeof ChatMessage>

export const Tool = T.Object(
  {
    type: T.Literal('function'),
    function: T.Object(
      {
        name: T.String({ minLength: 1, maxLength: 64 }),
        description: T.Optional(T.String()),
        parameters: T.Optional(T.Object({}, open)),
      },
      open,
    ),
  },
  open,
)

export const ChatRequest = T.Object(
  {
    model: T.String({ minLength: 1 }),
    messages: T.Array(ChatMessage, { minItems: 1 }),
    stream: T.Optional(T.Boolean()),
    stream_options: T.Optional(
      T.Union([T.Object({ include_usage: T.Optional(T.Boolean()) }, open), T.Null()]),
    ),
    temperature: T.Optional(T.Union([T.Number({ minimum: 0, maximum: 2 }), T.Null()])),
    top_p: T.Optional(T.Union([T.Number({ minimum: 0, maximum: 1 }), T.Null()])),
    n: T.Optional(T.Union([T.Integer({ minimum: 1, maximum: 128 }), T.Null()])),
    max_tokens: T.Optional(T.Union([T.Integer({ minimum: 1 }), T.Null()])),
    max_completion_tokens: T.Optional(T.Union([T.Integer({ minimum: 1 }), T.Null()])),
    presence_penalty: T.Optional(T.Union([T.Number({ minimum: -2, maximum: 2 }), T.Null()])),
    frequency_penalty: T.Optional(T.Union([T.Number({ minimum: -2, maximum: 2 }), T.Null()])),
    seed: T.Optional(T.Union([T.Integer(), T.Null()])),
    stop: T.Optional(T.Union([T.String(), T.Array(T.String(), { maxItems: 4 }), T.Null()])),
    logprobs: T.Optional(T.Union([T.Boolean(), T.Null()])),
    top_logprobs: T.Optional(T.Union([T.Integer({ minimum: 0, maximum: 20 }), T.Null()])),
    tools: T.Optional(T.Array(Tool)),
    tool_choice: T.Optional(
      T.Union([
        T.Literal('none'),
        T.Literal('auto'),
        T.Literal('required'),
        T.Object({ type: T.Literal('function'), function: T.Object({ name: T.String() }, open) }, open),
      ]),
    ),
    response_format: T.Optional(T.Object({ type: T.String() }, open)),
    user: T.Optional(T.String()),
    /** Fallback models (OpenRouter's form): tried in order when every node of `model` failed. */
    models: T.Optional(T.Array(T.String({ minLength: 1 }), { maxItems: 8 })),
  },
  open,
)
export type ChatRequest = Static<typeof ChatRequest>
