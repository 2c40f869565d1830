import type { ChatMessage } from '../api/chat.ts'
import { encode } from '../tokenizer.ts'

export { loadTokenizer, tokenizerLoaded as tokenizerReady } from '../tokenizer.ts'

export function countTokens(text: string): number {
  return text.length === 0 ? 0 : encode(text).length
}

/** Longest text counted in one go by countTokensYielding (about a millisecond). */
export const COUNT_SLICE_CHARS = 4096

/**
 * countTokens for a long text without holding the event loop: a slice at a time, each in a
 * macrotask of its own. Slices are cut only before a single space between two non-spaces, where
 * o200k's pre-tokenizer never joins across (a piece holding that space starts with it), so the
 * sum is the count of the whole.
 */
export async function countTokensYielding(text: string): Promise<number> {
  let n = 0
  let from = 0
  while (from < text.length) {
    await new Promise((resolve) => setImmediate(resolve))
    let cut = Math.min(text.length, from + COUNT_SLICE_CHARS)
    while (
      cut < text.length - 1 &&
      !(text[cut] === ' ' && NOT_SPACE.test(text[cut - 1]!) && NOT_SPACE.test(text[cut + 1]!))
    )
      cut++
    if (cut >= text.length - 1) cut = text.length
    n += countTokens(text.slice(from, cut))
    from = cut
  }
  return n
}

const NOT_SPACE = /\S/

/**
 * Prompt tokens to reserve for: Tropa's count plus half again and 16. Upstream models use their
 * own tokenizers (a llama vocabulary counted 22 tokens where o200k counted 12); the margin keeps
 * the charge, which never exceeds the reservation, equal to what the upstream reports.
 */
export function reservedPromptTokens(counted: number): number {
  return counted + Math.ceil(counted / 2) + 16
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
