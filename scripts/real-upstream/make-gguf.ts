#!/usr/bin/env bun
/**
 * make-gguf.ts — writes a tiny, random-weight, llama-architecture GGUF model.
 *
 * No npm or Debian package ships a GGUF model and this machine cannot reach a
 * model hub, so we generate one ourselves: GGUF v3, F32 tensors, alignment 32,
 * 2 layers, width 64, a few hundred unique SPM-style vocabulary entries plus the
 * 256 byte-fallback tokens <0x00>..<0xFF>. It answers gibberish, but it is a
 * real model that llama.cpp loads, tokenizes for and evaluates.
 *
 * Deterministic: the same --seed gives a byte-identical file.
 *
 * Usage: bun scripts/real-upstream/make-gguf.ts --out .real-upstream/tiny.gguf [--seed 42]
 *
 * Format reference: ggml's docs/gguf.md (header, metadata KV, tensor infos,
 * padding to general.alignment, tensor data).
 */

// ---------------------------------------------------------------- GGUF enums
const GGUF_MAGIC = 0x46554747 // "GGUF" little-endian
const GGUF_VERSION = 3
const ALIGNMENT = 32

enum T {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
}
const GGML_TYPE_F32 = 0

// SentencePiece / llama.cpp token types
const TOK_NORMAL = 1
const TOK_UNKNOWN = 2
const TOK_CONTROL = 3
const TOK_BYTE = 6

type KV =
  | { type: T.UINT32 | T.INT32 | T.FLOAT32 | T.BOOL | T.UINT64; value: number | boolean }
  | { type: T.STRING; value: string }
  | { type: T.ARRAY; itemType: T.STRING; value: string[] }
  | { type: T.ARRAY; itemType: T.FLOAT32 | T.INT32; value: number[] }

// ---------------------------------------------------------- binary writer
class Writer {
  private buf = new Uint8Array(1 << 16)
  private view = new DataView(this.buf.buffer)
  length = 0
  private static enc = new TextEncoder()

  private ensure(n: number) {
    if (this.length + n <= this.buf.length) return
    let cap = this.buf.length * 2
    while (cap < this.length + n) cap *= 2
    const next = new Uint8Array(cap)
    next.set(this.buf.subarray(0, this.length))
    this.buf = next
    this.view = new DataView(next.buffer)
  }
  u8(v: number) {
    this.ensure(1)
    this.view.setUint8(this.length, v)
    this.length += 1
  }
  u32(v: number) {
    this.ensure(4)
    this.view.setUint32(this.length, v, true)
    this.length += 4
  }
  i32(v: number) {
    this.ensure(4)
    this.view.setInt32(this.length, v, true)
    this.length += 4
  }
  u64(v: number | bigint) {
    this.ensure(8)
    this.view.setBigUint64(this.length, BigInt(v), true)
    this.length += 8
  }
  f32(v: number) {
    this.ensure(4)
    this.view.setFloat32(this.length, v, true)
    this.length += 4
  }
  bytes(b: Uint8Array) {
    this.ensure(b.length)
    this.buf.set(b, this.length)
    this.length += b.length
  }
  /** gguf_string_t: uint64 length + UTF-8 bytes (no NUL). */
  str(s: string) {
    const b = Writer.enc.encode(s)
    this.u64(b.length)
    this.bytes(b)
  }
  padTo(alignment: number) {
    while (this.length % alignment !== 0) this.u8(0)
  }
  result(): Uint8Array {
    return this.buf.subarray(0, this.length)
  }
}

function writeKV(w: Writer, key: string, kv: KV) {
  w.str(key)
  w.u32(kv.type)
  switch (kv.type) {
    case T.UINT32:
      w.u32(Number(kv.value))
      break
    case T.INT32:
      w.i32(Number(kv.value))
      break
    case T.FLOAT32:
      w.f32(Number(kv.value))
      break
    case T.BOOL:
      w.u8(kv.value ? 1 : 0)
      break
    case T.UINT64:
      w.u64(Number(kv.value))
      break
    case T.STRING:
      w.str(kv.value)
      break
    case T.ARRAY:
      w.u32(kv.itemType)
      w.u64(kv.value.length)
      for (const item of kv.value) {
        if (kv.itemType === T.STRING) w.str(item as string)
        else if (kv.itemType === T.FLOAT32) w.f32(item as number)
        else w.i32(item as number)
      }
      break
  }
}

// ------------------------------------------------------------ deterministic RNG
function mulberry32(seed: number) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

// ------------------------------------------------------------------ vocab
const SP = '\u2581' // SentencePiece's "▁" word-boundary marker

const WORDS = [
  'the',
  'a',
  'an',
  'and',
  'or',
  'of',
  'to',
  'in',
  'on',
  'is',
  'it',
  'that',
  'this',
  'for',
  'with',
  'as',
  'at',
  'by',
  'be',
  'are',
  'was',
  'from',
  'not',
  'but',
  'have',
  'you',
  'we',
  'they',
  'he',
  'she',
  'hello',
  'world',
  'model',
  'router',
  'token',
  'say',
  'hi',
  'yes',
  'no',
  'ok',
  'one',
  'two',
  'three',
  'four',
  'five',
  'rouble',
  'price',
  'stream',
  'chat',
  'user',
  'system',
  'assistant',
  'answer',
  'question',
  'tiny',
  'llama',
  'random',
  'word',
  'text',
  'data',
  'fast',
  'slow',
  'good',
  'bad',
]

export function buildVocab(): { tokens: string[]; scores: number[]; types: number[] } {
  const tokens: string[] = []
  const scores: number[] = []
  const types: number[] = []
  const seen = new Set<string>()
  const add = (piece: string, score: number, type: number) => {
    if (seen.has(piece)) return // llama.cpp aborts on duplicate token strings
    seen.add(piece)
    tokens.push(piece)
    scores.push(score)
    types.push(type)
  }

  add('<unk>', 0, TOK_UNKNOWN) // 0
  add('<s>', 0, TOK_CONTROL) // 1 = bos
  add('</s>', 0, TOK_CONTROL) // 2 = eos
  for (let b = 0; b < 256; b++) {
    add(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`, 0, TOK_BYTE) // 3..258
  }

  // Normal pieces. SPM merges adjacent symbols whose concatenation is in the
  // vocab, highest score first, so every prefix of a word is added too.
  const addNormal = (piece: string) => add(piece, -1000, TOK_NORMAL)
  addNormal(SP)
  for (let c = 0x21; c < 0x7f; c++) addNormal(String.fromCharCode(c))
  const pieces: string[] = []
  for (const word of WORDS) {
    const full = SP + word
    for (let i = 2; i <= full.length; i++) pieces.push(full.slice(0, i))
  }
  // Longer pieces get higher scores so they win merges.
  pieces.sort((x, y) => x.length - y.length || (x < y ? -1 : x > y ? 1 : 0))
  for (const p of pieces) {
    if (seen.has(p)) continue
    add(p, -100 + p.length, TOK_NORMAL)
  }
  return { tokens, scores, types }
}

// ----------------------------------------------------------------- model
export interface TinyModelOptions {
  seed?: number
  nEmbd?: number
  nLayer?: number
  nHead?: number
  nFf?: number
  contextLength?: number
  name?: string
}

export function makeTinyLlamaGguf(opts: TinyModelOptions = {}): Uint8Array {
  const seed = opts.seed ?? 42
  const nEmbd = opts.nEmbd ?? 64
  const nLayer = opts.nLayer ?? 2
  const nHead = opts.nHead ?? 4
  const nHeadKv = nHead
  const nFf = opts.nFf ?? 128
  const ctx = opts.contextLength ?? 2048
  const headDim = nEmbd / nHead
  const rand = mulberry32(seed)

  const { tokens, scores, types } = buildVocab()
  const nVocab = tokens.length

  const kvs: [string, KV][] = [
    ['general.architecture', { type: T.STRING, value: 'llama' }],
    ['general.name', { type: T.STRING, value: opts.name ?? 'tropa-tiny-random' }],
    ['general.alignment', { type: T.UINT32, value: ALIGNMENT }],
    ['general.file_type', { type: T.UINT32, value: 0 }], // ALL_F32
    ['llama.context_length', { type: T.UINT32, value: ctx }],
    ['llama.embedding_length', { type: T.UINT32, value: nEmbd }],
    ['llama.block_count', { type: T.UINT32, value: nLayer }],
    ['llama.feed_forward_length', { type: T.UINT32, value: nFf }],
    ['llama.attention.head_count', { type: T.UINT32, value: nHead }],
    ['llama.attention.head_count_kv', { type: T.UINT32, value: nHeadKv }],
    ['llama.attention.layer_norm_rms_epsilon', { type: T.FLOAT32, value: 1e-5 }],
    ['llama.rope.dimension_count', { type: T.UINT32, value: headDim }],
    ['llama.rope.freq_base', { type: T.FLOAT32, value: 10000 }],
    ['llama.vocab_size', { type: T.UINT32, value: nVocab }],
    ['tokenizer.ggml.model', { type: T.STRING, value: 'llama' }],
    ['tokenizer.ggml.tokens', { type: T.ARRAY, itemType: T.STRING, value: tokens }],
    ['tokenizer.ggml.scores', { type: T.ARRAY, itemType: T.FLOAT32, value: scores }],
    ['tokenizer.ggml.token_type', { type: T.ARRAY, itemType: T.INT32, value: types }],
    ['tokenizer.ggml.unknown_token_id', { type: T.UINT32, value: 0 }],
    ['tokenizer.ggml.bos_token_id', { type: T.UINT32, value: 1 }],
    ['tokenizer.ggml.eos_token_id', { type: T.UINT32, value: 2 }],
    ['tokenizer.ggml.add_bos_token', { type: T.BOOL, value: true }],
    ['tokenizer.ggml.add_eos_token', { type: T.BOOL, value: false }],
  ]

  // Tensor shapes are ggml order: ne[0] is the contiguous (input) dimension.
  type Tensor = { name: string; dims: number[]; init: 'ones' | 'randn'; scale?: number }
  const tensors: Tensor[] = [
    { name: 'token_embd.weight', dims: [nEmbd, nVocab], init: 'randn', scale: 1.0 },
    { name: 'output_norm.weight', dims: [nEmbd], init: 'ones' },
    { name: 'output.weight', dims: [nEmbd, nVocab], init: 'randn', scale: 0.5 },
  ]
  for (let l = 0; l < nLayer; l++) {
    const p = `blk.${l}.`
    const s = 1 / Math.sqrt(nEmbd)
    tensors.push(
      { name: `${p}attn_norm.weight`, dims: [nEmbd], init: 'ones' },
      { name: `${p}attn_q.weight`, dims: [nEmbd, nEmbd], init: 'randn', scale: s },
      { name: `${p}attn_k.weight`, dims: [nEmbd, headDim * nHeadKv], init: 'randn', scale: s },
      { name: `${p}attn_v.weight`, dims: [nEmbd, headDim * nHeadKv], init: 'randn', scale: s },
      { name: `${p}attn_output.weight`, dims: [nEmbd, nEmbd], init: 'randn', scale: s },
      { name: `${p}ffn_norm.weight`, dims: [nEmbd], init: 'ones' },
      { name: `${p}ffn_gate.weight`, dims: [nEmbd, nFf], init: 'randn', scale: s },
      { name: `${p}ffn_up.weight`, dims: [nEmbd, nFf], init: 'randn', scale: s },
      { name: `${p}ffn_down.weight`, dims: [nFf, nEmbd], init: 'randn', scale: 1 / Math.sqrt(nFf) },
    )
  }

  const w = new Writer()
  // Header
  w.u32(GGUF_MAGIC)
  w.u32(GGUF_VERSION)
  w.u64(tensors.length)
  w.u64(kvs.length)
  // Metadata
  for (const [k, v] of kvs) writeKV(w, k, v)
  // Tensor infos (offsets relative to start of the data section, aligned)
  let offset = 0
  const offsets: number[] = []
  for (const t of tensors) {
    w.str(t.name)
    w.u32(t.dims.length)
    for (const d of t.dims) w.u64(d)
    w.u32(GGML_TYPE_F32)
    w.u64(offset)
    offsets.push(offset)
    const nbytes = t.dims.reduce((a, b) => a * b, 1) * 4
    offset += Math.ceil(nbytes / ALIGNMENT) * ALIGNMENT
  }
  w.padTo(ALIGNMENT)
  const dataStart = w.length
  // Tensor data
  for (let i = 0; i < tensors.length; i++) {
    const t = tensors[i]!
    if (w.length - dataStart !== offsets[i]) throw new Error(`offset mismatch for ${t.name}`)
    const n = t.dims.reduce((a, b) => a * b, 1)
    for (let j = 0; j < n; j++) {
      if (t.init === 'ones') {
        w.f32(1)
      } else {
        // Box–Muller normal
        const u1 = Math.max(rand(), 1e-12)
        const u2 = rand()
        const z = Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2)
        w.f32(z * (t.scale ?? 0.02))
      }
    }
    w.padTo(ALIGNMENT)
  }
  return w.result()
}

// -------------------------------------------------------------------- CLI
if (import.meta.main) {
  const args = process.argv.slice(2)
  const get = (name: string) => {
    const i = args.indexOf(name)
    return i >= 0 ? args[i + 1] : undefined
  }
  const out = get('--out') ?? args.find((a) => !a.startsWith('--')) ?? '.real-upstream/tiny.gguf'
  const seed = Number(get('--seed') ?? 42)
  const t0 = performance.now()
  const bytes = makeTinyLlamaGguf({ seed })
  const { mkdirSync, writeFileSync } = await import('node:fs')
  const { dirname } = await import('node:path')
  mkdirSync(dirname(out), { recursive: true })
  writeFileSync(out, bytes)
  const ms = performance.now() - t0
  const vocab = buildVocab().tokens.length
  console.log(`wrote ${out}: ${bytes.length} bytes, vocab ${vocab}, seed ${seed}, ${ms.toFixed(1)} ms`)
}
