import type { ChatMessage } from '../api/chat.ts'
import { BLOCK_CHARS, BlockHasher, chainSeed } from '../routing/prefix.ts'

export interface PromptPrefix {
  /** Chained block hashes of the rendered prompt. */
  readonly blocks: readonly number[]
  /** Prompt tokens per block for this request (its own chars-per-token). */
  readonly blockTokens: number
}

const NONE: PromptPrefix = { blocks: [], blockTokens: 0 }
const seeds = new Map<string, number>()

/**
 * The chat prompt as an upstream template would lay it out (tools first, then each message's
 * role and content), cut into prefix blocks for the routing policy's prefix index. Only models
 * with more than one route are worth it.
 */
export function chatPrefix(
  modelId: string,
  messages: readonly ChatMessage[],
  tools: readonly unknown[] | undefined,
  promptTokens: number,
): PromptPrefix {
  const h = new BlockHasher(seedOf(modelId))
  if (tools && tools.length > 0) h.push(JSON.stringify(tools))
  for (const m of messages) {
    h.push(`\u0001${m.role}\u0002`)
    if (m.name) h.push(m.name)
    const c = m.content
    if (typeof c === 'string') h.push(c)
    else if (Array.isArray(c))
      for (const part of c) {
        if (part.type === 'text') h.push(part.text)
        else if (part.type === 'refusal') h.push(part.refusal)
        // A data URL can be megabytes: its length and tail stand for it.
        else if (part.type === 'image_url')
          h.push(`\u0003${part.image_url.url.length}:${part.image_url.url.slice(-256)}`)
        else h.push(`\u0003${part.type}`)
      }
    if (m.tool_calls) h.push(JSON.stringify(m.tool_calls))
  }
  if (h.hashes.length === 0) return NONE
  return { blocks: h.hashes, blockTokens: Math.max(1, (promptTokens * BLOCK_CHARS) / Math.max(1, h.chars)) }
}

/** A legacy completion's text prompt, cut into prefix blocks as it reaches the model (no template). */
export function textPrefix(modelId: string, prompt: string, promptTokens: number): PromptPrefix {
  const h = new BlockHasher(seedOf(modelId))
  h.push(prompt)
  if (h.hashes.length === 0) return NONE
  return { blocks: h.hashes, blockTokens: Math.max(1, (promptTokens * BLOCK_CHARS) / Math.max(1, h.chars)) }
}

function seedOf(modelId: string): number {
  let seed = seeds.get(modelId)
  if (seed === undefined) {
    seed = chainSeed(modelId)
    seeds.set(modelId, seed)
  }
  return seed
}

export const NO_PREFIX = NONE
