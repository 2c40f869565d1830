import { InvalidValue } from '../../../errors.ts'

// Tropa's internal request (OpenAI's chat body, as the pipeline built it) mapped to Anthropic's
// Messages API body. What has no Anthropic equivalent and would change the answer's shape is
// refused with a 400 naming the field; what only tunes sampling or bookkeeping is dropped (the
// README lists both).

type Json = Record<string, unknown>
type Block = Json

/** The image types the Messages API takes. */
const IMAGE_TYPES = new Set(['image/jpeg', 'image/png', 'image/gif', 'image/webp'])
const DATA_URL = /^data:([^;,]+);base64,/

interface Turn {
  role: 'user' | 'assistant'
  content: Block[]
}

/**
 * The Messages API body for an OpenAI chat body (its model already the upstream's). `sampling`:
 * whether the API version takes temperature and top_p (2023-06-01 does; 2026-10-21 refuses them).
 */
export function toAnthropicRequest(openai: Json, stream: boolean, sampling = true): Json {
  refuse(openai)
  const messages = openai.messages as Json[]
  const system: string[] = []
  const turns: Turn[] = []
  const push = (role: Turn['role'], blocks: Block[]) => {
    if (blocks.length === 0) return
    const last = turns[turns.length - 1]
    // Anthropic wants user and assistant turns to alternate: consecutive ones are merged.
    if (last?.role === role) last.content.push(...blocks)
    else turns.push({ role, content: blocks })
  }
  for (const [i, m] of messages.entries()) {
    const at = `messages[${i}]`
    if (m.role === 'system' || m.role === 'developer') {
      const text = textOf(m.content, at)
      if (text.length > 0) system.push(text)
    } else if (m.role === 'user') push('user', userBlocks(m.content, at))
    else if (m.role === 'assistant') {
      const blocks = assistantBlocks(m.content, at)
      const calls = Array.isArray(m.tool_calls) ? (m.tool_calls as Json[]) : []
      for (const [j, c] of calls.entries()) {
        const fn = (c.function ?? {}) as Json
        blocks.push({
          type: 'tool_use',
          id: c.id,
          name: fn.name,
          input: toolInput(fn.arguments, `${at}.tool_calls[${j}].function.arguments`),
        })
      }
      push('assistant', blocks)
    } else if (m.role === 'tool')
      push('user', [{ type: 'tool_result', tool_use_id: m.tool_call_id, content: textOf(m.content, at) }])
  }

  const out: Json = {
    model: openai.model,
    max_tokens: openai.max_tokens ?? openai.max_completion_tokens,
    messages: turns,
  }
  if (system.length === 1) out.system = system[0]
  else if (system.length > 1) out.system = system.map((text) => ({ type: 'text', text }))
  if (stream) out.stream = true
  const stop = openai.stop
  if (typeof stop === 'string') out.stop_sequences = [stop]
  else if (Array.isArray(stop) && stop.length > 0) out.stop_sequences = stop
  if (sampling && typeof openai.temperature === 'number') {
    if (openai.temperature > 1)
      throw new InvalidValue(
        `temperature ${openai.temperature} is above 1, the most Anthropic's models take`,
        'temperature',
      )
    out.temperature = openai.temperature
  }
  if (sampling && typeof openai.top_p === 'number') out.top_p = openai.top_p
  if (typeof openai.user === 'string' && openai.user.length > 0) out.metadata = { user_id: openai.user }
  const tools = Array.isArray(openai.tools) ? (openai.tools as Json[]) : []
  if (tools.length > 0) {
    out.tools = tools.map((t) => {
      const fn = (t.function ?? {}) as Json
      const tool: Json = {
        name: fn.name,
        // Anthropic wants an object schema; OpenAI lets parameters be absent or untyped.
        input_schema: { type: 'object', ...(fn.parameters as Json | undefined) },
      }
      if (typeof fn.description === 'string') tool.description = fn.description
      return tool
    })
    const choice = toolChoice(openai.tool_choice, openai.parallel_tool_calls === false)
    if (choice) out.tool_choice = choice
  }
  return out
}

/** Fields whose meaning Anthropic cannot give: a clear 400 rather than a silently different answer. */
function refuse(b: Json): void {
  if (typeof b.n === 'number' && b.n > 1)
    throw new InvalidValue('n above 1 is not supported by Anthropic models; send n separate requests', 'n')
  if (b.logprobs === true || (typeof b.top_logprobs === 'number' && b.top_logprobs > 0))
    throw new InvalidValue('logprobs are not available from Anthropic models', 'logprobs')
  const format = (b.response_format as Json | undefined)?.type
  if (format !== undefined && format !== 'text')
    throw new InvalidValue(
      `response_format ${JSON.stringify(format)} is not supported by Anthropic models; describe the format in the prompt or use a tool`,
      'response_format',
    )
  if (b.audio != null || (Array.isArray(b.modalities) && b.modalities.some((m) => m !== 'text')))
    throw new InvalidValue('audio output is not available from Anthropic models', 'modalities')
  if (b.logit_bias && typeof b.logit_bias === 'object' && Object.keys(b.logit_bias).length > 0)
    throw new InvalidValue('logit_bias is not supported by Anthropic models', 'logit_bias')
}

function toolChoice(choice: unknown, noParallel: boolean): Json | undefined {
  let out: Json | undefined
  if (choice === undefined || choice === null || choice === 'auto') out = { type: 'auto' }
  else if (choice === 'none') return { type: 'none' }
  else if (choice === 'required') out = { type: 'any' }
  else if (typeof choice === 'object') {
    const name = ((choice as Json).function as Json | undefined)?.name
    out = { type: 'tool', name }
  } else throw new InvalidValue(`tool_choice ${JSON.stringify(choice)} is not supported`, 'tool_choice')
  if (noParallel) out.disable_parallel_tool_use = true
  else if (choice === undefined || choice === null) return undefined // Anthropic's default is auto
  return out
}

/** A system (or tool) message's text: a string, or its text parts joined. */
function textOf(content: unknown, at: string): string {
  if (typeof content === 'string') return content
  if (!Array.isArray(content)) return ''
  return (content as Json[])
    .map((p, k) => {
      if (p.type === 'text') return p.text as string
      throw new InvalidValue(`${at}.content[${k}]: only text parts are allowed here`, `${at}.content`)
    })
    .join('\n')
}

function userBlocks(content: unknown, at: string): Block[] {
  if (typeof content === 'string') return content.length > 0 ? [{ type: 'text', text: content }] : []
  if (!Array.isArray(content)) return []
  const blocks: Block[] = []
  ;(content as Json[]).forEach((p, k) => {
    const where = `${at}.content[${k}]`
    if (p.type === 'text') {
      if ((p.text as string).length > 0) blocks.push({ type: 'text', text: p.text })
    } else if (p.type === 'image_url') blocks.push(imageBlock((p.image_url as Json).url as string, where))
    else if (p.type === 'file') blocks.push(documentBlock(p.file as Json, where))
    else
      throw new InvalidValue(`${where}: ${String(p.type)} parts are not supported by Anthropic models`, where)
  })
  return blocks
}

function imageBlock(url: string, where: string): Block {
  const data = DATA_URL.exec(url)
  if (data) {
    const mediaType = data[1]!.toLowerCase()
    if (!IMAGE_TYPES.has(mediaType))
      throw new InvalidValue(
        `${where}: image type ${JSON.stringify(mediaType.slice(0, 50))} is not supported; send JPEG, PNG, GIF or WebP`,
        where,
      )
    return {
      type: 'image',
      source: { type: 'base64', media_type: mediaType, data: url.slice(data[0].length) },
    }
  }
  if (/^https?:\/\//i.test(url)) return { type: 'image', source: { type: 'url', url } }
  throw new InvalidValue(`${where}: an image must be a base64 data URL or an http(s) URL`, where)
}

/** A PDF sent as an OpenAI file part with its data inline: Anthropic's document block. */
function documentBlock(file: Json, where: string): Block {
  const data = typeof file.file_data === 'string' ? DATA_URL.exec(file.file_data) : null
  if (!data || data[1]!.toLowerCase() !== 'application/pdf')
    throw new InvalidValue(`${where}: only PDF files sent inline (file_data) are supported here`, where)
  return {
    type: 'document',
    source: {
      type: 'base64',
      media_type: 'application/pdf',
      data: (file.file_data as string).slice(data[0].length),
    },
  }
}

function assistantBlocks(content: unknown, at: string): Block[] {
  if (typeof content === 'string') return content.length > 0 ? [{ type: 'text', text: content }] : []
  if (!Array.isArray(content)) return []
  const blocks: Block[] = []
  ;(content as Json[]).forEach((p, k) => {
    const text = p.type === 'text' ? p.text : p.type === 'refusal' ? p.refusal : undefined
    if (typeof text !== 'string')
      throw new InvalidValue(`${at}.content[${k}]: only text parts are allowed here`, `${at}.content`)
    if (text.length > 0) blocks.push({ type: 'text', text })
  })
  return blocks
}

/** A tool call's arguments (a JSON text in OpenAI's form) as the object Anthropic wants. */
function toolInput(args: unknown, param: string): unknown {
  if (args === undefined || args === null || args === '') return {}
  if (typeof args !== 'string') throw new InvalidValue(`${param} must be a JSON string`, param)
  let input: unknown
  try {
    input = JSON.parse(args)
  } catch {
    throw new InvalidValue(`${param} is not valid JSON`, param)
  }
  if (!input || typeof input !== 'object' || Array.isArray(input))
    throw new InvalidValue(`${param} must be a JSON object for Anthropic models`, param)
  return input
}
