import type { ChatMessage, ChatRequest, ContentPart } from '../api/chat.ts'
import type { InputItem, ResponsesContentPart, ResponsesRequest } from '../api/responses.ts'
import { InvalidValue, quoted } from '../errors.ts'
import { sortableId } from '../ids.ts'
import type { Usage } from '../upstream/sse.ts'

/** A conversation item as stored and replayed (the Responses API's input item form). */
export type Item = InputItem & { type?: string }

export interface MessageOutput {
  type: 'message'
  id: string
  role: 'assistant'
  status: 'in_progress' | 'completed' | 'incomplete'
  content: { type: 'output_text'; text: string; annotations: never[]; logprobs: never[] }[]
}
export interface FunctionCallOutput {
  type: 'function_call'
  id: string
  call_id: string
  name: string
  arguments: string
  status: 'in_progress' | 'completed' | 'incomplete'
}
export type OutputItem = MessageOutput | FunctionCallOutput

export const newMessageId = () => `msg_${sortableId()}`
export const newCallItemId = () => `fc_${sortableId()}`

/** The request's input as items: a string is one user message; an item without a type is a message. */
export function inputItems(input: ResponsesRequest['input']): Item[] {
  if (typeof input === 'string') return [{ type: 'message', role: 'user', content: input } as Item]
  return input.map((item) =>
    (item as { type?: unknown }).type === undefined ? ({ ...item, type: 'message' } as Item) : item,
  )
}

/**
 * Items -> chat messages. Items before `from` come from the stored conversation (their errors
 * name previous_response_id), the rest from this request's `input`.
 */
export function itemsToMessages(items: readonly Item[], from: number): ChatMessage[] {
  const messages: ChatMessage[] = []
  const calls = new Set<string>()
  items.forEach((item, i) => {
    const at = i >= from ? `input[${i - from}]` : 'previous_response_id'
    const type = item.type ?? 'message'
    if (type === 'message') {
      const m = item as { role: ChatMessage['role']; content: string | ResponsesContentPart[] }
      // `developer` is OpenAI's newer name for system; not every upstream knows it.
      const role = m.role === 'developer' ? 'system' : m.role
      if (role !== 'user' && Array.isArray(m.content) && m.content.some((p) => p.type === 'input_image'))
        throw new InvalidValue(`${at}: only user messages may carry input_image parts`, `${at}.content`)
      const content =
        typeof m.content === 'string'
          ? m.content
          : role === 'assistant'
            ? partsText(m.content, at)
            : m.content.map((p, j) => chatPart(p, `${at}.content[${j}]`))
      messages.push({ role, content })
      return
    }
    if (type === 'function_call') {
      const c = item as { call_id: string; name: string; arguments: string }
      calls.add(c.call_id)
      const call = {
        id: c.call_id,
        type: 'function' as const,
        function: { name: c.name, arguments: c.arguments },
      }
      const last = messages.at(-1)
      // An answer's text and its calls (or parallel calls) are one assistant message in chat.
      if (last?.role === 'assistant') last.tool_calls = [...(last.tool_calls ?? []), call]
      else messages.push({ role: 'assistant', content: null, tool_calls: [call] })
      return
    }
    if (type === 'function_call_output') {
      const o = item as { call_id: string; output: string | ResponsesContentPart[] }
      if (!calls.has(o.call_id))
        throw new InvalidValue(
          `${at}: no function_call with call_id ${quoted(o.call_id)} comes before this function_call_output`,
          `${at}.call_id`,
        )
      messages.push({
        role: 'tool',
        tool_call_id: o.call_id,
        content: typeof o.output === 'string' ? o.output : partsText(o.output, at),
      })
      return
    }
    throw new InvalidValue(
      `${at}: input items of type ${quoted(type)} are not supported; send message, function_call or function_call_output items`,
      `${at}.type`,
    )
  })
  return messages
}

function chatPart(p: ResponsesContentPart, at: string): ContentPart {
  if (p.type === 'input_text' || p.type === 'output_text')
    return { type: 'text', text: (p as unknown as { text: string }).text }
  if (p.type === 'input_image') {
    const img = p as { image_url?: string | null; detail?: 'auto' | 'low' | 'high' }
    if (!img.image_url)
      throw new InvalidValue(
        `${at}: an input_image needs image_url (a URL or a data URL); file_id is not supported`,
        `${at}.image_url`,
      )
    return { type: 'image_url', image_url: { url: img.image_url, ...(img.detail && { detail: img.detail }) } }
  }
  throw new InvalidValue(
    `${at}: content parts of type ${quoted(p.type)} are not supported; send input_text, output_text or input_image`,
    `${at}.type`,
  )
}

/** Text-only content (an assistant's, a function's output) as one string. */
function partsText(parts: readonly ResponsesContentPart[], at: string): string {
  let text = ''
  parts.forEach((p, j) => {
    if (p.type !== 'input_text' && p.type !== 'output_text')
      throw new InvalidValue(
        `${at}.content[${j}]: only input_text and output_text parts are allowed here`,
        `${at}.content[${j}].type`,
      )
    text += (p as unknown as { text: string }).text
  })
  return text
}

/** The chat request Tropa's lifecycle runs for a Responses request over these items. */
export function toChatRequest(body: ResponsesRequest, items: readonly Item[], from: number): ChatRequest {
  // (TypeBox checks a record's values and count, not its keys' length)
  for (const key of Object.keys(body.metadata ?? {}))
    if (key.length > 64) throw new InvalidValue('metadata: a key may be at most 64 characters', 'metadata')
  const messages = itemsToMessages(items, from)
  if (body.instructions) messages.unshift({ role: 'system', content: body.instructions })
  if (messages.length === 0)
    throw new InvalidValue('input is empty: send a string or at least one input item', 'input')
  const tools = body.tools?.map((tool, i) => {
    if (tool.type !== 'function')
      throw new InvalidValue(
        `tools[${i}]: ${quoted(tool.type)} tools are not supported; Tropa serves function tools only`,
        `tools[${i}].type`,
      )
    const t = tool as unknown as {
      name: string
      description?: string | null
      parameters?: object | null
      strict?: boolean | null
    }
    return {
      type: 'function' as const,
      function: {
        name: t.name,
        ...(t.description != null && { description: t.description }),
        ...(t.parameters != null && { parameters: t.parameters }),
        ...(t.strict != null && { strict: t.strict }),
      },
    }
  })
  const choice = body.tool_choice
  const format = body.text?.format
  const chat: ChatRequest = {
    model: body.model,
    messages,
    ...(tools && tools.length > 0 && { tools }),
    ...(choice !== undefined && {
      tool_choice:
        typeof choice === 'string' ? choice : { type: 'function', function: { name: choice.name } },
    }),
    ...(body.parallel_tool_calls != null && tools && { parallel_tool_calls: body.parallel_tool_calls }),
    ...(body.max_output_tokens != null && { max_tokens: body.max_output_tokens }),
    ...(body.temperature != null && { temperature: body.temperature }),
    ...(body.top_p != null && { top_p: body.top_p }),
    ...(body.user != null && { user: body.user }),
    ...(format?.type === 'json_object' && { response_format: { type: 'json_object' } }),
    ...(format?.type === 'json_schema' && { response_format: jsonSchemaFormat(format) }),
    ...(body.stream === true && { stream: true, stream_options: { include_usage: true } }),
  }
  return chat
}

/** Responses' `text.format` json_schema as chat's response_format. */
function jsonSchemaFormat(format: object): { type: string } {
  const f = format as { name: string; schema: object; description?: string; strict?: boolean | null }
  return {
    type: 'json_schema',
    json_schema: {
      name: f.name,
      schema: f.schema,
      ...(f.description !== undefined && { description: f.description }),
      ...(f.strict != null && { strict: f.strict }),
    },
  } as { type: string }
}

/** Chat usage (with Tropa's cost) as the Responses API's usage. */
export function responsesUsage(u: Usage) {
  return {
    input_tokens: u.prompt_tokens,
    input_tokens_details: { cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0 },
    output_tokens: u.completion_tokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: u.total_tokens ?? u.prompt_tokens + u.completion_tokens,
    ...(u.cost_rub !== undefined && { cost_rub: u.cost_rub }),
    ...(u.receipt !== undefined && { receipt: u.receipt }),
    ...(u.estimated === true && { estimated: true }),
  }
}
export type ResponsesUsage = ReturnType<typeof responsesUsage>

/** What a Response object repeats of its request, fixed when the request arrives. */
export interface ResponseHead {
  id: string
  createdAt: number
  model: string
  body: ResponsesRequest
  store: boolean
}

/** A chat finish reason as the Responses API's status. */
export function statusOf(finish: string | null | undefined): {
  status: 'completed' | 'incomplete'
  incomplete_details: { reason: string } | null
} {
  if (finish === 'length')
    return { status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' } }
  if (finish === 'content_filter')
    return { status: 'incomplete', incomplete_details: { reason: 'content_filter' } }
  return { status: 'completed', incomplete_details: null }
}

/** The Response object. */
export function responseObject(
  head: ResponseHead,
  status: 'in_progress' | 'completed' | 'incomplete' | 'failed',
  output: readonly OutputItem[],
  usage: ResponsesUsage | null,
  extra: {
    incomplete_details?: { reason: string } | null
    error?: { code: string; message: string } | null
  } = {},
) {
  const b = head.body
  return {
    id: head.id,
    object: 'response',
    created_at: head.createdAt,
    status,
    background: false,
    error: extra.error ?? null,
    incomplete_details: extra.incomplete_details ?? null,
    instructions: b.instructions ?? null,
    max_output_tokens: b.max_output_tokens ?? null,
    model: head.model,
    output,
    parallel_tool_calls: b.parallel_tool_calls ?? true,
    previous_response_id: b.previous_response_id ?? null,
    reasoning: { effort: null, summary: null },
    store: head.store,
    temperature: b.temperature ?? null,
    text: b.text ?? { format: { type: 'text' } },
    tool_choice: b.tool_choice ?? 'auto',
    tools: b.tools ?? [],
    top_p: b.top_p ?? null,
    truncation: 'disabled',
    usage,
    user: b.user ?? null,
    metadata: b.metadata ?? {},
  }
}
export type ResponseObject = ReturnType<typeof responseObject>

export function messageOutput(id: string, text: string, status: 'completed' | 'incomplete'): MessageOutput {
  return {
    type: 'message',
    id,
    role: 'assistant',
    status,
    content: [{ type: 'output_text', text, annotations: [], logprobs: [] }],
  }
}

/** A non-streamed chat completion's first choice as Responses output items. */
export function outputOfCompletion(
  message: { content?: unknown; tool_calls?: unknown } | undefined,
  itemStatus: 'completed' | 'incomplete',
): OutputItem[] {
  const out: OutputItem[] = []
  const text = typeof message?.content === 'string' ? message.content : ''
  const calls = Array.isArray(message?.tool_calls)
    ? (message.tool_calls as { id?: unknown; function?: { name?: unknown; arguments?: unknown } }[])
    : []
  if (text.length > 0 || calls.length === 0) out.push(messageOutput(newMessageId(), text, itemStatus))
  for (const c of calls)
    out.push({
      type: 'function_call',
      id: newCallItemId(),
      call_id: typeof c.id === 'string' ? c.id : newCallItemId(),
      name: typeof c.function?.name === 'string' ? c.function.name : '',
      arguments: typeof c.function?.arguments === 'string' ? c.function.arguments : '',
      status: 'completed',
    })
  return out
}

/** A non-streamed chat completion (its usage the one billed) as the Response object. */
export function responseOfCompletion(
  head: ResponseHead,
  completion: {
    choices?: unknown
    usage: Usage
  },
): ResponseObject {
  const choices = Array.isArray(completion.choices)
    ? (completion.choices as {
        message?: { content?: unknown; tool_calls?: unknown }
        finish_reason?: string | null
      }[])
    : []
  const choice = choices[0]
  const { status, incomplete_details } = statusOf(choice?.finish_reason)
  const output = outputOfCompletion(choice?.message, status === 'completed' ? 'completed' : 'incomplete')
  return responseObject(head, status, output, responsesUsage(completion.usage), { incomplete_details })
}
