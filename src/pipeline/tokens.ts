import type { ChatMessage } from '../api/chat.ts'

type Encode = (text: string) => number[]
let encodeFn: Encode | undefined
let loading: Promise<void> | undefined

/**
 * Loads the tokenizer (o200k_base through gpt-tokenizer). It takes a few hundred milliseconds,
 * so main.ts starts it after the server listens rather than delaying start-up; the first
 * request that needs it waits for it.
 */
export function loadTokenizer(): Promise<void> {
  loading ??= import('gpt-tokenizer').then((m) => {
    encodeFn = m.encode
  })
  return loading
}

export function tokenizerReady(): boolean {
  return encodeFn !== undefined
}

export function countTokens(text: string): number {
  if (text.length === 0) return 0
  if (!encodeFn) throw new Error('tokenizer not loaded: await loadTokenizer() first')
  return encodeFn(text).length
}

// Per-message framing tokens, as OpenAI counts them for its chat models.
const PER_MESSAGE = 3
const REPLY_PRIMING = 3
// Images cost what OpenAI bills for a 1024x1024 image at high detail unless asked for low:
// an overestimate is safe (it only widens the reservation), an underestimate is not.
const IMAGE_LOW = 85
const IMAGE_HIGH = 765

/** Prompt tokens of a chat request as Tropa counts them for the context check and the reservation. */
export function countChatPrompt(
  messages: readonly ChatMessage[],
  tools: readonly unknown[] | undefined,
): number {
  let n = REPLY_PRIMING
  for (const m of messages) {
    n += PER_MESSAGE + 1
    if (m.name) n += countTokens(m.name) + 1
    const c = m.content
    if (typeof c === 'string') n += countTokens(c)
    else if (Array.isArray(c)) {
      for (const part of c) {
        switch (part.type) {
          case 'text':
            n += countTokens(part.text)
            break
          case 'refusal':
            n += countTokens(part.refusal)
            break
          case 'image_url':
            n += part.image_url.detail === 'low' ? IMAGE_LOW : IMAGE_HIGH
            break
          case 'input_audio':
            // about 10 tokens per second of audio; 16 kB of base64 is roughly a second
            n += Math.ceil(part.input_audio.data.length / 1600)
            break
          case 'file':
            n += Math.ceil(JSON.stringify(part.file).length / 4)
            break
        }
      }
    }
    if (m.tool_calls) n += countTokens(JSON.stringify(m.tool_calls))
  }
  if (tools && tools.length > 0) n += countTokens(JSON.stringify(tools))
  return n
}
