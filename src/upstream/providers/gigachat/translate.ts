import { InvalidValue } from '../../../errors.ts'
import type { Usage } from '../../sse.ts'
import { randomId } from '../lines.ts'

// OpenAI's chat form <-> GigaChat's (https://developers.sber.ru/docs/ru/gigachat/api/reference/rest/post-chat):
// tools are `functions` and `function_call`; an assistant's tool call is one `function_call`
// ({name, arguments: object}) per message; a tool's result is a `function` message named after the
// function, whose content is a JSON string. Replies and chunks come back in OpenAI's form.

interface OpenAIMessage {
  role?: unknown
  content?: unknown
  name?: unknown
  tool_calls?: { id?: unknown; function?: { name?: unknown; arguments?: unknown } }[]
  tool_call_id?: unknown
}

export interface GigaMessage {
  role: string
  content: string
  function_call?: { name: string; arguments: Record<string, unknown> }
  name?: string
  /** Ids of files uploaded to GigaChat's storage (the adapter fills them in, see InlineImage). */
  attachments?: string[]
}

/**
 * An image of a user message, given as a base64 data URL: the adapter uploads it (POST /files)
 * before the chat call and puts the file id in `message.attachments`.
 */
export interface InlineImage {
  /** Where it was, for errors: messages[i].content[j]. */
  readonly where: string
  readonly mime: string
  /** The image, still base64 (hashed for the upload cache, decoded only to upload). */
  readonly base64: string
  /** The image's size, decoded. */
  readonly bytes: number
  readonly message: GigaMessage
}

/** The image types GigaChat's storage takes (its reference: jpeg, png, tiff, bmp). */
export const IMAGE_TYPES: Readonly<Record<string, string>> = {
  'image/jpeg': 'jpg',
  'image/jpg': 'jpg',
  'image/png': 'png',
  'image/tiff': 'tiff',
  'image/bmp': 'bmp',
}
/** GigaChat's limits: 15 MB an image, one image a message, 10 images a request. */
export const MAX_IMAGE_BYTES = 15 * 1024 * 1024
export const MAX_IMAGES = 10
const DATA_URL = /^data:([\w.+-]+\/[\w.+-]+)(?:;[^,;]*)*;base64,/i
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/

/** The text of an OpenAI message content (a string or text parts); other parts are refused. */
function textOf(content: unknown, where: string): string {
  if (content === null || content === undefined) return ''
  if (typeof content === 'string') return content
  if (!Array.isArray(content))
    throw new InvalidValue(`${where}.content must be a string or an array of parts`, where)
  let text = ''
  for (const [j, part] of (content as { type?: unknown; text?: unknown }[]).entries()) {
    if (part?.type === 'text' && typeof part.text === 'string') text += part.text
    else
      throw new InvalidValue(
        part?.type === 'image_url'
          ? `${where}.content[${j}]: GigaChat routes take images in user messages only`
          : `${where}.content[${j}]: GigaChat routes take text and image_url parts only`,
        `${where}.content[${j}]`,
      )
  }
  return text
}

/** A user message: its text, and its image (GigaChat takes one per message) queued for upload. */
function userMessage(content: unknown, where: string, images: InlineImage[]): GigaMessage {
  if (!Array.isArray(content)) return { role: 'user', content: textOf(content, where) }
  const message: GigaMessage = { role: 'user', content: '' }
  let text = ''
  let image: InlineImage | undefined
  for (const [j, p] of (
    content as { type?: unknown; text?: unknown; image_url?: { url?: unknown } }[]
  ).entries()) {
    const at = `${where}.content[${j}]`
    if (p?.type === 'text' && typeof p.text === 'string') text += p.text
    else if (p?.type === 'image_url') {
      if (image)
        throw new InvalidValue(
          `${at}: GigaChat takes one image per message (send the others in messages of their own)`,
          at,
        )
      image = inlineImage(p.image_url?.url, at, message)
      images.push(image)
      if (images.length > MAX_IMAGES)
        throw new InvalidValue(`${at}: GigaChat takes at most ${MAX_IMAGES} images per request`, at)
    } else textOf([p], where) // refuses it with the reason
  }
  message.content = text
  return message
}

function inlineImage(url: unknown, at: string, message: GigaMessage): InlineImage {
  const param = `${at}.image_url.url`
  if (typeof url !== 'string') throw new InvalidValue(`${param} must be a string`, param)
  const m = DATA_URL.exec(url)
  if (!m) {
    if (/^https?:/i.test(url))
      throw new InvalidValue(
        `${param}: GigaChat cannot fetch images by URL (and Tropa does not fetch URLs for it): send the image as a base64 data URL`,
        param,
      )
    throw new InvalidValue(`${param} must be a base64 data URL (data:image/png;base64,...)`, param)
  }
  const mime = m[1]!.toLowerCase()
  if (!IMAGE_TYPES[mime])
    throw new InvalidValue(
      `${param}: GigaChat takes ${Object.keys(IMAGE_TYPES)
        .filter((t) => t !== 'image/jpg')
        .join(', ')} images, not ${mime.slice(0, 40)}`,
      param,
    )
  const base64 = url.slice(m[0].length)
  const padding = base64.endsWith('==') ? 2 : base64.endsWith('=') ? 1 : 0
  const bytes = Math.floor((base64.length * 3) / 4) - padding
  if (bytes > MAX_IMAGE_BYTES)
    throw new InvalidValue(
      `${param}: the image is ${bytes} bytes, above GigaChat's limit of ${MAX_IMAGE_BYTES} bytes per image`,
      param,
    )
  if (base64.length === 0 || base64.length % 4 !== 0 || !BASE64.test(base64))
    throw new InvalidValue(`${param}: the image data is not valid base64`, param)
  return { where: at, mime, base64, bytes, message }
}

function argumentsObject(raw: unknown, where: string): Record<string, unknown> {
  if (raw === undefined || raw === '') return {}
  try {
    const v = typeof raw === 'string' ? JSON.parse(raw) : raw
    if (v && typeof v === 'object' && !Array.isArray(v)) return v as Record<string, unknown>
  } catch {
    // below
  }
  throw new InvalidValue(`${where}.function.arguments must be a JSON object for GigaChat`, where)
}

/** A tool result as GigaChat wants it: a JSON string (text that is not JSON is wrapped). */
function functionResult(text: string): string {
  try {
    JSON.parse(text)
    return text
  } catch {
    return JSON.stringify({ result: text })
  }
}

/**
 * Tropa's OpenAI chat body -> GigaChat's request body. Throws InvalidValue for what it cannot take.
 * The images of user messages (base64 data URLs) are pushed to `images`, for the adapter to
 * upload and attach.
 */
export function toGigaChatRequest(
  body: Record<string, unknown>,
  images: InlineImage[] = [],
): Record<string, unknown> {
  const messages = Array.isArray(body.messages) ? (body.messages as OpenAIMessage[]) : []
  const out: GigaMessage[] = []
  const callNames = new Map<string, string>()
  messages.forEach((m, i) => {
    const where = `messages[${i}]`
    const role = m.role
    if (role === 'system' || role === 'developer')
      out.push({ role: 'system', content: textOf(m.content, where) })
    else if (role === 'user') out.push(userMessage(m.content, where, images))
    else if (role === 'assistant') {
      const content = textOf(m.content, where)
      const calls = Array.isArray(m.tool_calls) ? m.tool_calls : []
      if (calls.length === 0) out.push({ role: 'assistant', content })
      calls.forEach((c, j) => {
        const name = typeof c?.function?.name === 'string' ? c.function.name : ''
        if (typeof c?.id === 'string') callNames.set(c.id, name)
        // GigaChat's assistant message holds one function call: one message per call.
        out.push({
          role: 'assistant',
          content: j === 0 ? content : '',
          function_call: {
            name,
            arguments: argumentsObject(c?.function?.arguments, `${where}.tool_calls[${j}]`),
          },
        })
      })
    } else if (role === 'tool' || role === 'function') {
      const name =
        (typeof m.tool_call_id === 'string' && callNames.get(m.tool_call_id)) ||
        (typeof m.name === 'string' ? m.name : '')
      out.push({ role: 'function', name, content: functionResult(textOf(m.content, where)) })
    } else
      throw new InvalidValue(
        `${where}.role ${JSON.stringify(role)} is not supported on GigaChat routes`,
        where,
      )
  })
  const req: Record<string, unknown> = { model: body.model, messages: out, stream: body.stream === true }
  const maxTokens = body.max_tokens ?? body.max_completion_tokens
  if (typeof maxTokens === 'number') req.max_tokens = maxTokens
  if (typeof body.temperature === 'number') req.temperature = body.temperature
  if (typeof body.top_p === 'number') req.top_p = body.top_p
  if (body.stream === true) req.update_interval = 0
  const rf = body.response_format as { type?: unknown } | undefined
  if (rf && rf.type !== 'text')
    throw new InvalidValue('response_format is not supported on GigaChat routes', 'response_format')
  if (typeof body.n === 'number' && body.n !== 1)
    throw new InvalidValue('n must be 1 on GigaChat routes', 'n')
  const tools = Array.isArray(body.tools)
    ? (body.tools as { type?: unknown; function?: Record<string, unknown> }[])
    : []
  if (tools.length > 0) {
    req.functions = tools.map((t, i) => {
      if (t?.type !== 'function' || !t.function)
        throw new InvalidValue(`tools[${i}]: GigaChat routes take function tools only`, `tools[${i}]`)
      const f = t.function
      return {
        name: f.name,
        ...(f.description !== undefined && { description: f.description }),
        parameters: f.parameters ?? { type: 'object', properties: {} },
      }
    })
    const choice = body.tool_choice as unknown
    if (choice === 'none') req.function_call = 'none'
    else if (choice && typeof choice === 'object') {
      const name = (choice as { function?: { name?: unknown } }).function?.name
      if (typeof name !== 'string') throw new InvalidValue('tool_choice names no function', 'tool_choice')
      req.function_call = { name }
    } else req.function_call = 'auto' // 'auto', 'required' (GigaChat has no forced call but by name) or unset
  }
  return req
}

/** GigaChat's finish reasons in OpenAI's words. */
export function finishReason(r: unknown): string | null {
  if (r === undefined || r === null) return null
  if (r === 'function_call') return 'tool_calls'
  if (r === 'length') return 'length'
  if (r === 'blacklist') return 'content_filter'
  return 'stop'
}

/** GigaChat's usage in OpenAI's form (precached_prompt_tokens -> cached_tokens). */
export function openAIUsage(u: unknown): Usage | undefined {
  if (!u || typeof u !== 'object') return undefined
  const { prompt_tokens, completion_tokens, total_tokens, precached_prompt_tokens } = u as Record<
    string,
    unknown
  >
  const usage: Usage = {
    prompt_tokens: prompt_tokens as number,
    completion_tokens: completion_tokens as number,
    total_tokens: (total_tokens as number) ?? (prompt_tokens as number) + (completion_tokens as number),
  }
  if (typeof precached_prompt_tokens === 'number')
    usage.prompt_tokens_details = { cached_tokens: precached_prompt_tokens }
  return usage
}

interface GigaChoice {
  index?: unknown
  message?: { content?: unknown; function_call?: { name?: unknown; arguments?: unknown } }
  delta?: { role?: unknown; content?: unknown; function_call?: { name?: unknown; arguments?: unknown } }
  finish_reason?: unknown
}

function toolCall(fc: { name?: unknown; arguments?: unknown }) {
  return {
    id: `call_${randomId()}`,
    type: 'function',
    function: {
      name: typeof fc.name === 'string' ? fc.name : '',
      arguments: typeof fc.arguments === 'string' ? fc.arguments : JSON.stringify(fc.arguments ?? {}),
    },
  }
}

/** A GigaChat chat completion -> OpenAI's. */
export function toOpenAICompletion(reply: Record<string, unknown>, model: unknown): Record<string, unknown> {
  const choices = Array.isArray(reply.choices) ? (reply.choices as GigaChoice[]) : []
  return {
    id: `chatcmpl-${randomId()}`,
    object: 'chat.completion',
    created: typeof reply.created === 'number' ? reply.created : Math.floor(Date.now() / 1000),
    model,
    choices: choices.map((c, i) => {
      const fc = c.message?.function_call
      const content = typeof c.message?.content === 'string' ? c.message.content : ''
      return {
        index: typeof c.index === 'number' ? c.index : i,
        message: {
          role: 'assistant',
          content: fc && content === '' ? null : content,
          ...(fc && { tool_calls: [toolCall(fc)] }),
        },
        finish_reason: finishReason(c.finish_reason) ?? 'stop',
      }
    }),
    ...(reply.usage !== undefined && { usage: openAIUsage(reply.usage) }),
  }
}

/** The OpenAI chunks of one GigaChat stream chunk: its choices, then (if it carries usage) the usage chunk. */
export function toOpenAIChunks(chunk: Record<string, unknown>, id: string, model: unknown): unknown[] {
  const created = typeof chunk.created === 'number' ? chunk.created : Math.floor(Date.now() / 1000)
  const out: unknown[] = []
  const choices = Array.isArray(chunk.choices) ? (chunk.choices as GigaChoice[]) : []
  if (choices.length > 0)
    out.push({
      id,
      object: 'chat.completion.chunk',
      created,
      model,
      choices: choices.map((c, i) => {
        const d = c.delta ?? {}
        const delta: Record<string, unknown> = {}
        if (d.role === 'assistant') delta.role = 'assistant'
        if (typeof d.content === 'string' && d.content !== '') delta.content = d.content
        if (d.function_call) delta.tool_calls = [{ index: 0, ...toolCall(d.function_call) }]
        return {
          index: typeof c.index === 'number' ? c.index : i,
          delta,
          finish_reason: finishReason(c.finish_reason),
        }
      }),
    })
  if (chunk.usage)
    out.push({
      id,
      object: 'chat.completion.chunk',
      created,
      model,
      choices: [],
      usage: openAIUsage(chunk.usage),
    })
  return out
}
