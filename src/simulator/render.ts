import { encode } from '../tokenizer.ts'

/** Tokens an image part costs in the simulator's accounting. */
export const IMAGE_TOKENS = 85

interface Message {
  role?: unknown
  content?: unknown
  tool_calls?: unknown
  tool_call_id?: unknown
}

/** The prompt as the simulated model sees it: its tokens (for the prefix cache) and count. */
export function renderPrompt(messages: readonly Message[]): { tokens: number[]; count: number } {
  let text = ''
  let images = 0
  for (const m of messages) {
    text += `<${String(m.role)}>\n`
    if (typeof m.content === 'string') text += m.content
    else if (Array.isArray(m.content)) {
      for (const part of m.content as { type?: string; text?: unknown }[]) {
        if (part?.type === 'text' && typeof part.text === 'string') text += part.text
        else if (part?.type === 'image_url') images++
      }
    }
    if (m.tool_calls) text += JSON.stringify(m.tool_calls)
    if (typeof m.tool_call_id === 'string') text += m.tool_call_id
    text += '\n'
  }
  const tokens = encode(text)
  return { tokens, count: tokens.length + images * IMAGE_TOKENS }
}

/** Tokens of an embedding input item (a string, or already token ids). */
export function inputTokens(item: unknown): number {
  if (typeof item === 'string') return encode(item).length
  if (Array.isArray(item)) return item.length
  return 0
}
