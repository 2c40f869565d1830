/**
 * An approximate prefix index: which node has recently been sent which prompt prefix.
 *
 * A prompt is cut into fixed-size blocks and each block's hash is chained from the previous one
 * (seeded by the model), so two prompts share their first k block hashes exactly when they share
 * their first k blocks. Each node keeps a bounded LRU set of the hashes dispatched to it; the
 * longest run of a request's hashes found there predicts how much of its prompt the node holds
 * in its KV cache. The router never sees the upstream's tokens, so blocks are characters of the
 * rendered prompt, and matched blocks turn into tokens with the request's own chars-per-token.
 */

/** Characters per block: about 64 tokens of English or code. */
export const BLOCK_CHARS = 256

const FNV_OFFSET = 0x811c9dc5
const FNV_PRIME = 0x01000193

/** Seed of a model's chain, so equal prompts to different models do not match. */
export function chainSeed(modelId: string): number {
  let h = FNV_OFFSET
  for (let i = 0; i < modelId.length; i++) h = Math.imul(h ^ modelId.charCodeAt(i), FNV_PRIME) >>> 0
  return h
}

/**
 * Feeds text into a chain of block hashes. Text can arrive in pieces (one per message part);
 * only full blocks produce a hash, and a piece boundary does not break a block.
 */
export class BlockHasher {
  readonly hashes: number[] = []
  private h: number
  private filled = 0
  chars = 0

  constructor(seed: number) {
    this.h = seed
  }

  push(text: string): void {
    let h = this.h
    let filled = this.filled
    for (let i = 0; i < text.length; i++) {
      h = Math.imul(h ^ text.charCodeAt(i), FNV_PRIME)
      if (++filled === BLOCK_CHARS) {
        // Finalise the block (avalanche) and chain: the next block starts from this hash.
        h = Math.imul(h ^ (h >>> 15), 0x85ebca6b)
        h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) ^ (h >>> 16)
        h >>>= 0
        this.hashes.push(h)
        filled = 0
      }
    }
    this.h = h
    this.filled = filled
    this.chars += text.length
  }
}

/** One node's recently dispatched block hashes, least recently used first. */
export class PrefixIndex {
  private readonly blocks = new Map<number, true>()

  constructor(readonly capacityBlocks: number) {}

  get size(): number {
    return this.blocks.size
  }

  /** Number of leading blocks of `prefix` this node has seen (consecutive from the first). */
  match(prefix: readonly number[]): number {
    const blocks = this.blocks
    let n = 0
    while (n < prefix.length && blocks.has(prefix[n]!)) n++
    return n
  }

  /** Records that the node was sent this prompt: its blocks become the most recent. */
  insert(prefix: readonly number[]): void {
    const blocks = this.blocks
    for (const h of prefix) {
      if (blocks.has(h)) blocks.delete(h)
      blocks.set(h, true)
    }
    let over = blocks.size - this.capacityBlocks
    if (over <= 0) return
    for (const oldest of blocks.keys()) {
      blocks.delete(oldest)
      if (--over === 0) break
    }
  }

  /** Drops the least recently used blocks beyond `maxBlocks`. */
  trim(maxBlocks: number): void {
    let over = this.blocks.size - maxBlocks
    if (over <= 0) return
    for (const oldest of this.blocks.keys()) {
      this.blocks.delete(oldest)
      if (--over === 0) break
    }
  }

  clear(): void {
    this.blocks.clear()
  }
}
