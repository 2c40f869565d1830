import { type Static, Type as T, type TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import type { ValueError } from '@sinclair/typebox/value'

// OpenAI's Responses API (POST /v1/responses) as Tropa checks it. Unlike chat, the request is
// translated, not passed through, so a field Tropa does not know is refused (OpenAI refuses it
// too) rather than silently dropped. Items and content parts stay open: the SDK adds fields such
// as `id` and `status` to items it sends back.
const open = { additionalProperties: true } as const
const closed = { additionalProperties: false } as const

export const InputText = T.Object({ type: T.Literal('input_text'), text: T.String() }, open)
export const OutputText = T.Object({ type: T.Literal('output_text'), text: T.String() }, open)
export const InputImage = T.Object(
  {
    type: T.Literal('input_image'),
    image_url: T.Optional(T.Union([T.String({ minLength: 1 }), T.Null()])),
    file_id: T.Optional(T.Union([T.String(), T.Null()])),
    detail: T.Optional(T.Union([T.Literal('auto'), T.Literal('low'), T.Literal('high')])),
  },
  open,
)
/**
 * A content part as the request schema checks it: any type. A known type is then checked by its
 * own schema above (http/routes/responses.ts, so a malformed one gets a precise param), any
 * other (input_file, input_audio, ...) is refused by name when translated.
 */
export const ContentPart = T.Object({ type: T.String() }, open)
export type ResponsesContentPart = Static<typeof ContentPart>
/** The schema of each known part type. */
export const PART_SCHEMAS = { input_text: InputText, output_text: OutputText, input_image: InputImage }

export const MessageItem = T.Object(
  {
    type: T.Optional(T.Literal('message')),
    role: T.Union([T.Literal('user'), T.Literal('assistant'), T.Literal('system'), T.Literal('developer')]),
    content: T.Union([T.String(), T.Array(ContentPart)]),
  },
  open,
)
export const FunctionCallItem = T.Object(
  {
    type: T.Literal('function_call'),
    call_id: T.String({ minLength: 1 }),
    name: T.String({ minLength: 1 }),
    arguments: T.String(),
  },
  open,
)
export const FunctionCallOutputItem = T.Object(
  {
    type: T.Literal('function_call_output'),
    call_id: T.String({ minLength: 1 }),
    output: T.Union([T.String(), T.Array(ContentPart)]),
  },
  open,
)
/**
 * An input item as the request schema checks it: an object with an optional type (a message has
 * none). A known type is then checked by its own schema (ITEM_SCHEMAS); any other (reasoning,
 * item_reference, built-in tool calls, ...) is refused by name when translated.
 */
export const InputItem = T.Object({ type: T.Optional(T.String()) }, open)
export type InputItem = Static<typeof InputItem>
/** The schema of each known item type. */
export const ITEM_SCHEMAS = {
  message: MessageItem,
  function_call: FunctionCallItem,
  function_call_output: FunctionCallOutputItem,
}

export const FunctionTool = T.Object(
  {
    type: T.Literal('function'),
    name: T.String({ minLength: 1, maxLength: 64 }),
    description: T.Optional(T.Union([T.String(), T.Null()])),
    parameters: T.Optional(T.Union([T.Object({}, open), T.Null()])),
    strict: T.Optional(T.Union([T.Boolean(), T.Null()])),
  },
  open,
)
/** A tool as the request schema checks it; a function tool is then checked by FunctionTool, built-in tools (web_search, file_search, ...) are refused by name. */
export const AnyTool = T.Object({ type: T.String() }, open)
export const TOOL_SCHEMAS = { function: FunctionTool }

export const ResponsesRequest = T.Object(
  {
    model: T.String({ minLength: 1 }),
    input: T.Union([T.String(), T.Array(InputItem)]),
    instructions: T.Optional(T.Union([T.String(), T.Null()])),
    tools: T.Optional(T.Array(AnyTool)),
    tool_choice: T.Optional(
      T.Union([
        T.Literal('none'),
        T.Literal('auto'),
        T.Literal('required'),
        T.Object({ type: T.Literal('function'), name: T.String({ minLength: 1 }) }, open),
      ]),
    ),
    parallel_tool_calls: T.Optional(T.Union([T.Boolean(), T.Null()])),
    max_output_tokens: T.Optional(T.Union([T.Integer({ minimum: 1 }), T.Null()])),
    temperature: T.Optional(T.Union([T.Number({ minimum: 0, maximum: 2 }), T.Null()])),
    top_p: T.Optional(T.Union([T.Number({ minimum: 0, maximum: 1 }), T.Null()])),
    stream: T.Optional(T.Union([T.Boolean(), T.Null()])),
    store: T.Optional(T.Union([T.Boolean(), T.Null()])),
    previous_response_id: T.Optional(T.Union([T.String({ minLength: 1 }), T.Null()])),
    metadata: T.Optional(
      T.Union([
        T.Record(T.String({ maxLength: 64 }), T.String({ maxLength: 512 }), { maxProperties: 16 }),
        T.Null(),
      ]),
    ),
    user: T.Optional(T.Union([T.String(), T.Null()])),
    /** Only the text format; json_object and json_schema become chat's response_format. */
    text: T.Optional(
      T.Union([
        T.Object(
          {
            format: T.Optional(
              T.Union([
                T.Object({ type: T.Literal('text') }, open),
                T.Object({ type: T.Literal('json_object') }, open),
                T.Object(
                  {
                    type: T.Literal('json_schema'),
                    name: T.String({ minLength: 1 }),
                    schema: T.Object({}, open),
                    description: T.Optional(T.String()),
                    strict: T.Optional(T.Union([T.Boolean(), T.Null()])),
                  },
                  open,
                ),
              ]),
            ),
          },
          open,
        ),
        T.Null(),
      ]),
    ),
    truncation: T.Optional(T.Union([T.Literal('disabled'), T.Null()])),
    // Accepted and ignored (clients such as Codex send them): no model here reasons, every
    // output is included, there is one service tier; prompt_cache_key keys routing affinity.
    reasoning: T.Optional(T.Union([T.Object({}, open), T.Null()])),
    include: T.Optional(T.Union([T.Array(T.String(), { maxItems: 64 }), T.Null()])),
    prompt_cache_key: T.Optional(T.Union([T.String({ maxLength: 1024 }), T.Null()])),
    service_tier: T.Optional(T.Union([T.String({ maxLength: 64 }), T.Null()])),
    safety_identifier: T.Optional(T.Union([T.String({ maxLength: 1024 }), T.Null()])),
    stream_options: T.Optional(T.Union([T.Object({}, open), T.Null()])),
    background: T.Optional(T.Union([T.Literal(false), T.Null()])),
  },
  closed,
)
export type ResponsesRequest = Static<typeof ResponsesRequest>

type Checker = ReturnType<typeof TypeCompiler.Compile>
const compiled = (schemas: Record<string, TSchema>) =>
  new Map<string, Checker>(Object.entries(schemas).map(([k, v]) => [k, TypeCompiler.Compile(v)]))
const ITEMS = compiled(ITEM_SCHEMAS)
const PARTS = compiled(PART_SCHEMAS)
const TOOLS = compiled(TOOL_SCHEMAS)

function firstError(check: Checker | undefined, value: unknown, path: string): ValueError | undefined {
  if (!check || check.Check(value)) return undefined
  const e = check.Errors(value).First()
  return e && { ...e, path: `${path}${e.path}` }
}

/**
 * The first item, part or tool of a known type that breaks that type's schema (the request
 * schema lets any type through, so that a malformed known one is named precisely and an unknown
 * one is refused by name when translated). Its path is from the body's root.
 */
export function knownTypeError(body: ResponsesRequest): ValueError | undefined {
  for (const [i, tool] of (body.tools ?? []).entries()) {
    const e = firstError(TOOLS.get(tool.type), tool, `/tools/${i}`)
    if (e) return e
  }
  if (typeof body.input === 'string') return undefined
  for (const [i, item] of body.input.entries()) {
    const type = item.type ?? 'message'
    const e = firstError(ITEMS.get(type), item, `/input/${i}`)
    if (e) return e
    const field = type === 'message' ? 'content' : type === 'function_call_output' ? 'output' : undefined
    const parts = field && (item as Record<string, unknown>)[field]
    if (Array.isArray(parts))
      for (const [j, p] of (parts as { type: string }[]).entries()) {
        const pe = firstError(PARTS.get(p.type), p, `/input/${i}/${field}/${j}`)
        if (pe) return pe
      }
  }
  return undefined
}
