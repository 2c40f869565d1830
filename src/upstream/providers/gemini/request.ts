import { InvalidValue } from '../../../errors.ts'

// OpenAI's chat and embeddings bodies (as Tropa built them: the model already the upstream's,
// max_tokens the reserved bound) mapped to the Gemini API's generateContent and
// batchEmbedContents requests (https://ai.google.dev/api/generate-content). What Gemini cannot
// take is refused with a 400 naming the field, never dropped silently when it changes the answer.

type Json = Record<string, unknown>

/** Joins a thought signature to a tool call id, so that the client's next turn carries it back. */
export const SIGNATURE_MARK = '~ts~'

interface ChatBody {
  model?: unknown
  messages?: unknown
  tools?: unknown
  tool_choice?: unknown
  max_tokens?: unknown
  max_completion_tokens?: unknown
  temperature?: unknown
  top_p?: unknown
  stop?: unknown
  n?: unknown
  seed?: unknown
  presence_penalty?: unknown
  frequency_penalty?: unknown
  response_format?: unknown
  logprobs?: unknown
  top_logprobs?: unknown
}

interface OpenAIMessage {
  role?: unknown
  content?: unknown
  tool_calls?: unknown
  tool_call_id?: unknown
  name?: unknown
}

/** The generateContent body for an OpenAI chat body. Throws InvalidValue for what Gemini cannot take. */
export function toGenerateContent(body: ChatBody): Json {
  if (!Array.isArray(body.messages)) throw new InvalidValue('messages must be an array', 'messages')
  if (body.n !== undefined && body.n !== null && body.n !== 1)
    throw new InvalidValue('n must be 1 on a Gemini route (one candidate per request)', 'n')
  if (body.logprobs === true || body.top_logprobs !== undefined)
    throw new InvalidValue('logprobs are not available on a Gemini route', 'logprobs')
  const system: Json[] = []
  const contents: { role: string; parts: Json[] }[] = []
  // Tool call id -> function name, for the tool messages that answer them.
  const callNames = new Map<string, string>()
  const push = (role: string, parts: Json[], merge: boolean) => {
    const last = contents[contents.length - 1]
    if (merge && last && last.role === role) last.parts.push(...parts)
    else contents.push({ role, parts })
  }
  body.messages.forEach((raw, i) => {
    const m = raw as OpenAIMessage
    const where = `messages[${i}]`
    switch (m?.role) {
      case 'system':
      case 'developer':
        system.push(...textParts(m.content, where))
        return
      case 'user': {
        const parts = userParts(m.content, where)
        if (parts.length > 0) push('user', parts, false)
        return
      }
      case 'assistant': {
        const parts: Json[] = m.content === null || m.content === undefined ? [] : textParts(m.content, where)
        if (Array.isArray(m.tool_calls))
          m.tool_calls.forEach((c, j) => {
            parts.push(functionCallPart(c, `${where}.tool_calls[${j}]`, callNames))
          })
        if (parts.length > 0) push('model', parts, false)
        return
      }
      case 'tool': {
        const id = typeof m.tool_call_id === 'string' ? m.tool_call_id : ''
        const name = callNames.get(id)
        if (name === undefined)
          throw new InvalidValue(
            `${where}.tool_call_id does not match a tool call of an earlier assistant message`,
            `${where}.tool_call_id`,
          )
        const text = joinText(m.content, where)
        // Parallel calls' answers go back together, as one turn of functionResponse parts.
        push('user', [{ functionResponse: { name, response: toolResponse(text) } }], true)
        return
      }
      default:
        throw new InvalidValue(`${where}.role ${JSON.stringify(m?.role)} is not supported`, `${where}.role`)
    }
  })
  if (contents.length === 0)
    throw new InvalidValue('a Gemini route needs at least one user or assistant message', 'messages')
  const out: Json = { contents }
  if (system.length > 0) out.systemInstruction = { parts: system }
  const tools = functionDeclarations(body.tools)
  if (tools) out.tools = [{ functionDeclarations: tools }]
  const toolConfig = functionCallingConfig(body.tool_choice)
  if (toolConfig) out.toolConfig = { functionCallingConfig: toolConfig }
  const gen = generationConfig(body)
  if (Object.keys(gen).length > 0) out.generationConfig = gen
  return out
}

function textParts(content: unknown, where: string): Json[] {
  const text = joinText(content, where)
  return text.length > 0 ? [{ text }] : []
}

/** A message's text: a string, or the text parts of an array. */
function joinText(content: unknown, where: string): string {
  if (typeof content === 'string') return content
  if (content === null || content === undefined) return ''
  if (!Array.isArray(content))
    throw new InvalidValue(`${where}.content must be a string or an array`, `${where}.content`)
  let text = ''
  content.forEach((p, j) => {
    const part = p as { type?: unknown; text?: unknown }
    if (part?.type !== 'text' || typeof part.text !== 'string')
      throw new InvalidValue(`${where}.content[${j}] must be a text part here`, `${where}.content[${j}]`)
    text += part.text
  })
  return text
}

const DATA_URL = /^data:([\w.+-]+\/[\w.+-]+)(?:;[^,;]*)*;base64,/
const IMAGE_TYPES: Record<string, string> = {
  png: 'image/png',
  jpg: 'image/jpeg',
  jpeg: 'image/jpeg',
  webp: 'image/webp',
  gif: 'image/gif',
  heic: 'image/heic',
  heif: 'image/heif',
}
const AUDIO_TYPES: Record<string, string> = { wav: 'audio/wav', mp3: 'audio/mp3' }

function userParts(content: unknown, where: string): Json[] {
  if (typeof content === 'string') return content.length > 0 ? [{ text: content }] : []
  if (!Array.isArray(content))
    throw new InvalidValue(`${where}.content must be a string or an array`, `${where}.content`)
  return content.map((p, j) => {
    const at = `${where}.content[${j}]`
    const part = p as {
      type?: unknown
      text?: unknown
      image_url?: { url?: unknown }
      input_audio?: { data?: unknown; format?: unknown }
    }
    if (part?.type === 'text' && typeof part.text === 'string') return { text: part.text }
    if (part?.type === 'image_url' && typeof part.image_url?.url === 'string') {
      const url = part.image_url.url
      const m = DATA_URL.exec(url)
      if (m) return { inlineData: { mimeType: m[1]!.toLowerCase(), data: url.slice(m[0].length) } }
      if (/^https?:\/\//i.test(url)) {
        // Gemini fetches public URLs itself (FileData); the MIME type, when the name tells it.
        let path = ''
        try {
          path = new URL(url).pathname
        } catch {
          throw new InvalidValue(`${at}.image_url.url is not a valid URL`, `${at}.image_url.url`)
        }
        const ext = /\.([a-z0-9]+)$/i.exec(path)?.[1]?.toLowerCase()
        const mimeType = ext ? IMAGE_TYPES[ext] : undefined
        return { fileData: { fileUri: url, ...(mimeType && { mimeType }) } }
      }
      throw new InvalidValue(
        `${at}.image_url.url must be a base64 data URL or an http(s) URL`,
        `${at}.image_url.url`,
      )
    }
    if (part?.type === 'input_audio' && typeof part.input_audio?.data === 'string') {
      const mimeType = AUDIO_TYPES[String(part.input_audio.format)]
      if (!mimeType)
        throw new InvalidValue(`${at}.input_audio.format must be wav or mp3`, `${at}.input_audio.format`)
      return { inlineData: { mimeType, data: part.input_audio.data } }
    }
    throw new InvalidValue(`${at}: a Gemini route takes text, image_url and input_audio parts`, at)
  })
}

function functionCallPart(raw: unknown, where: string, names: Map<string, string>): Json {
  const c = raw as { id?: unknown; type?: unknown; function?: { name?: unknown; arguments?: unknown } }
  const name = c?.function?.name
  if (typeof name !== 'string' || name.length === 0)
    throw new InvalidValue(`${where}.function.name is required`, `${where}.function.name`)
  let args: unknown = {}
  const text = c.function?.arguments
  if (typeof text === 'string' && text.trim().length > 0) {
    try {
      args = JSON.parse(text)
    } catch {
      throw new InvalidValue(`${where}.function.arguments is not valid JSON`, `${where}.function.arguments`)
    }
  }
  if (!args || typeof args !== 'object' || Array.isArray(args))
    throw new InvalidValue(`${where}.function.arguments must be a JSON object`, `${where}.function.arguments`)
  const id = typeof c.id === 'string' ? c.id : ''
  names.set(id, name)
  const part: Json = { functionCall: { name, args } }
  // A thinking model's signature rides in the id Tropa gave the call; it goes back with it.
  const mark = id.indexOf(SIGNATURE_MARK)
  if (mark >= 0) part.thoughtSignature = id.slice(mark + SIGNATURE_MARK.length)
  return part
}

/** A tool's output as Gemini's response object: a JSON object as it is, anything else as `output`. */
function toolResponse(text: string): Json {
  if (text.startsWith('{')) {
    try {
      const v = JSON.parse(text) as unknown
      if (v && typeof v === 'object' && !Array.isArray(v)) return v as Json
    } catch {
      // plain text
    }
  }
  return { output: text }
}

function functionDeclarations(tools: unknown): Json[] | undefined {
  if (tools === undefined || tools === null) return undefined
  if (!Array.isArray(tools)) throw new InvalidValue('tools must be an array', 'tools')
  if (tools.length === 0) return undefined
  return tools.map((t, i) => {
    const tool = t as {
      type?: unknown
      function?: { name?: unknown; description?: unknown; parameters?: unknown }
    }
    if (tool?.type !== 'function' || typeof tool.function?.name !== 'string')
      throw new InvalidValue(`tools[${i}]: a Gemini route takes function tools only`, `tools[${i}]`)
    const d: Json = { name: tool.function.name }
    if (typeof tool.function.description === 'string') d.description = tool.function.description
    // JSON Schema as OpenAI's clients write it: Gemini takes it as parametersJsonSchema.
    if (tool.function.parameters !== undefined) d.parametersJsonSchema = tool.function.parameters
    return d
  })
}

function functionCallingConfig(choice: unknown): Json | undefined {
  if (choice === undefined || choice === null) return undefined
  if (choice === 'auto') return { mode: 'AUTO' }
  if (choice === 'none') return { mode: 'NONE' }
  if (choice === 'required') return { mode: 'ANY' }
  const name = (choice as { function?: { name?: unknown } })?.function?.name
  if (typeof name === 'string') return { mode: 'ANY', allowedFunctionNames: [name] }
  throw new InvalidValue('tool_choice must be auto, none, required or a function', 'tool_choice')
}

function generationConfig(body: ChatBody): Json {
  const gen: Json = {}
  const max = body.max_completion_tokens ?? body.max_tokens
  if (typeof max === 'number') gen.maxOutputTokens = max
  if (typeof body.temperature === 'number') gen.temperature = body.temperature
  if (typeof body.top_p === 'number') gen.topP = body.top_p
  if (typeof body.seed === 'number') gen.seed = body.seed
  if (typeof body.presence_penalty === 'number') gen.presencePenalty = body.presence_penalty
  if (typeof body.frequency_penalty === 'number') gen.frequencyPenalty = body.frequency_penalty
  if (typeof body.stop === 'string') gen.stopSequences = [body.stop]
  else if (Array.isArray(body.stop) && body.stop.length > 0) gen.stopSequences = body.stop
  const format = body.response_format as { type?: unknown; json_schema?: { schema?: unknown } } | undefined
  if (format && format.type !== 'text') {
    if (format.type === 'json_object') gen.responseMimeType = 'application/json'
    else if (
      format.type === 'json_schema' &&
      format.json_schema?.schema &&
      typeof format.json_schema.schema === 'object'
    ) {
      gen.responseMimeType = 'application/json'
      gen.responseJsonSchema = format.json_schema.schema
    } else
      throw new InvalidValue(
        'response_format must be text, json_object or json_schema with a schema',
        'response_format',
      )
  }
  return gen
}

/** The batchEmbedContents body for an OpenAI embeddings body (text inputs only). */
export function toBatchEmbed(
  body: { model?: unknown; input?: unknown; dimensions?: unknown },
  model: string,
): Json {
  const inputs = typeof body.input === 'string' ? [body.input] : body.input
  if (!Array.isArray(inputs) || !inputs.every((x) => typeof x === 'string'))
    throw new InvalidValue(
      'a Gemini route embeds text: input must be a string or an array of strings',
      'input',
    )
  const name = `models/${model}`
  return {
    requests: inputs.map((text) => ({
      model: name,
      content: { parts: [{ text }] },
      ...(typeof body.dimensions === 'number' && { outputDimensionality: body.dimensions }),
    })),
  }
}
