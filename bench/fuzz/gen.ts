// The request generator of the schema-driven fuzzer: operations read from the OpenAPI document
// Tropa serves at /docs/json, values drawn from their JSON schemas, then hand-written mutators
// (types, bounds, depth, size, unicode, duplicate keys, missing and extra fields, content types,
// multipart corruption, query strings, credentials, methods). Deterministic for a seed.

/** A small fast PRNG (mulberry32): the same seed gives the same requests. */
export class Rng {
  private s: number
  constructor(seed: number) {
    this.s = seed >>> 0
  }
  next(): number {
    this.s = (this.s + 0x6d2b79f5) >>> 0
    let t = this.s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1))
  }
  chance(p: number): boolean {
    return this.next() < p
  }
  pick<T>(xs: readonly T[]): T {
    return xs[Math.floor(this.next() * xs.length)]!
  }
}

export interface JsonSchema {
  type?: string
  properties?: Record<string, JsonSchema>
  required?: string[]
  items?: JsonSchema
  anyOf?: JsonSchema[]
  const?: unknown
  minimum?: number
  maximum?: number
  exclusiveMinimum?: number
  minLength?: number
  maxLength?: number
  minItems?: number
  maxItems?: number
  pattern?: string
  additionalProperties?: boolean | JsonSchema
}

export interface Operation {
  method: string
  /** OpenAPI path with {params}. */
  path: string
  params: { name: string; in: string }[]
  body?: JsonSchema
}

/** The operations of an OpenAPI 3 document. */
export function operationsOf(doc: {
  paths: Record<
    string,
    Record<string, { parameters?: { name: string; in: string }[]; requestBody?: unknown }>
  >
}): Operation[] {
  const ops: Operation[] = []
  for (const [path, methods] of Object.entries(doc.paths))
    for (const [method, op] of Object.entries(methods)) {
      const rb = op.requestBody as { content?: Record<string, { schema?: JsonSchema }> } | undefined
      const body = rb?.content?.['application/json']?.schema
      ops.push({ method: method.toUpperCase(), path, params: op.parameters ?? [], ...(body && { body }) })
    }
  return ops
}

/** What the fuzzer knows of the server it runs against. */
export interface Target {
  chatModels: string[]
  embeddingModels: string[]
  /** Ids that exist (an org, a key), so that some paths hit real rows. */
  ids: string[]
}

const WEIRD_STRINGS = [
  '',
  ' ',
  '\u0000',
  '\ud800',
  '\udfff',
  '\u202e\u0627\u0644\u0639\u0631\u0628\u064a\u0629',
  '\u200b\u200d\ufeff',
  '\ud83d\ude00\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67',
  'Привет, мир',
  '日本語のテキスト',
  '../../../etc/passwd',
  '%00%ff%2e%2e',
  '\r\nX-Injected: 1',
  '<script>alert(1)</script>',
  "'; DROP TABLE keys; --",
  '$' + '{jndi:ldap://x}',
  '__proto__',
  'constructor',
  '9'.repeat(400),
  '-1',
  'NaN',
  'null',
]

/** A value the schema accepts (mostly), small enough for a quick upstream answer. */
export function sampleOf(s: JsonSchema, rng: Rng, target: Target, name = '', depth = 0): unknown {
  if (s.const !== undefined) return s.const
  if (s.anyOf) return sampleOf(rng.pick(s.anyOf), rng, target, name, depth)
  switch (s.type) {
    case 'object': {
      const o: Record<string, unknown> = {}
      for (const [k, sub] of Object.entries(s.properties ?? {})) {
        const required = s.required?.includes(k)
        if (required || (depth < 3 && rng.chance(0.3))) o[k] = sampleOf(sub, rng, target, k, depth + 1)
      }
      return o
    }
    case 'array': {
      const n = Math.max(s.minItems ?? 0, rng.int(s.minItems ?? 0, Math.min(s.maxItems ?? 3, 3)))
      return Array.from({ length: n }, () => sampleOf(s.items ?? {}, rng, target, name, depth + 1))
    }
    case 'string':
      return stringFor(name, s, rng, target)
    case 'integer': {
      // Output bounds stay small so valid requests are answered quickly.
      const hi = /tokens/.test(name) ? 8 : Math.min(s.maximum ?? 100, 100)
      return rng.int(Math.max(s.minimum ?? 0, 0), Math.max(hi, s.minimum ?? 0))
    }
    case 'number': {
      const lo = s.minimum ?? s.exclusiveMinimum ?? 0
      const hi = s.maximum ?? lo + 10
      return (
        Math.round((lo + rng.next() * (hi - lo)) * 1000) / 1000 ||
        (s.exclusiveMinimum !== undefined ? 0.5 : 0)
      )
    }
    case 'boolean':
      return name === 'stream' ? rng.chance(0.3) : rng.chance(0.5)
    case 'null':
      return null
  }
  return rng.chance(0.5) ? 'x' : 1
}

function stringFor(name: string, s: JsonSchema, rng: Rng, target: Target): string {
  if (name === 'model') {
    const all = [...target.chatModels, ...target.embeddingModels]
    return rng.chance(0.9) ? rng.pick(all) : rng.pick(['nope/model', '', 'x'.repeat(300)])
  }
  if (name === 'role') return rng.pick(['user', 'system', 'assistant', 'tool', 'developer'])
  if (name === 'url') return rng.pick(['data:image/png;base64,iVBORw0KGgo=', 'https://example.invalid/a.png'])
  if (name.endsWith('_id') && target.ids.length > 0 && rng.chance(0.5)) return rng.pick(target.ids)
  const len = rng.int(Math.max(s.minLength ?? 1, 1), Math.min(s.maxLength ?? 24, 24))
  let out = ''
  for (let i = 0; i < len; i++)
    out += String.fromCharCode(rng.chance(0.8) ? rng.int(97, 122) : rng.int(0x20, 0x7e))
  return out
}

/** One generated HTTP request. */
export interface FuzzRequest {
  method: string
  path: string
  headers: Record<string, string>
  body?: string | Uint8Array<ArrayBuffer>
  /** Which mutator made it (for the report). */
  kind: string
}

export type Credential = 'api' | 'master' | 'admin' | 'none' | 'bogus'

/** The credentials a request may carry; the runner maps them to real secrets. */
export interface Secrets {
  api: string
  master: string
  admin: string
}

const METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS']
const CONTENT_TYPES = [
  'text/plain',
  'application/x-www-form-urlencoded',
  'multipart/form-data',
  'multipart/form-data; boundary=',
  'application/json; charset=utf-16',
  'application/xml',
  '',
]

const DEEP = '\u0000deep:'

/** JSON text with each deep-nesting marker replaced by arrays and objects nested that deep. */
function spliceDeep(text: string): string {
  return text.replace(/"\\u0000deep:(\d+)"/g, (_, d: string) => {
    const n = Number(d)
    return `${'[{"a":'.repeat(n >> 1)}1${'}]'.repeat(n >> 1)}`
  })
}

/** A JSON value with one random leaf or subtree changed by one mutator. */
function mutateValue(v: unknown, rng: Rng): { value: unknown; kind: string } {
  if (v === null || typeof v !== 'object') return { value: v, kind: 'none' }
  // Walk to a random container.
  let node = v as Record<string, unknown>
  for (let i = 0; i < 4; i++) {
    const keys = Object.keys(node)
    if (keys.length === 0) break
    const k = rng.pick(keys)
    const child = node[k]
    if (child && typeof child === 'object' && rng.chance(0.6)) node = child as Record<string, unknown>
    else break
  }
  const keys = Object.keys(node)
  const k = keys.length > 0 && rng.chance(0.85) ? rng.pick(keys) : `extra_${rng.int(0, 99)}`
  const m = rng.int(0, 11)
  switch (m) {
    case 0:
      node[k] = rng.pick([null, true, false, 0, -1, 1.5, 1e308, -1e308, '', 'x', [], {}, [1, 'a', null]])
      return { value: v, kind: 'type' }
    case 1:
      node[k] = rng.pick([-1, 0, 2 ** 31, 2 ** 53 + 1, -(2 ** 53), 1e21, 0.1, 3, 129, 100_000_000])
      return { value: v, kind: 'bounds' }
    case 2:
      delete node[k]
      return { value: v, kind: 'missing' }
    case 3:
      node[k] = rng.pick(WEIRD_STRINGS)
      return { value: v, kind: 'unicode' }
    case 4:
      // Spliced into the JSON text after serialization (JSON.stringify itself overflows).
      node[k] = `${DEEP}${rng.pick([10, 63, 65, 200, 5_000, 50_000])}`
      return { value: v, kind: 'depth' }
    case 5:
      node[k] = 'z'.repeat(rng.pick([1_000, 100_000, 1_000_000]))
      return { value: v, kind: 'size' }
    case 6:
      node[k] = Array.from({ length: rng.pick([100, 5_000, 50_000]) }, (_, i) =>
        rng.chance(0.5) ? i : { i },
      )
      return { value: v, kind: 'size' }
    case 7:
      node[`${k}_${rng.int(0, 9)}`] = rng.pick(WEIRD_STRINGS)
      return { value: v, kind: 'extra' }
    case 8:
      // An own "__proto__" key, as JSON.parse makes one.
      Object.defineProperty(node, '__proto__', {
        value: { polluted: true },
        enumerable: true,
        writable: true,
        configurable: true,
      })
      return { value: v, kind: 'extra' }
    case 9:
      node[k] = 'Ж'.repeat(rng.pick([1_000, 30_000]))
      return { value: v, kind: 'unicode' }
    case 10:
      node[k] = rng.pick([NaN, Number.POSITIVE_INFINITY]) // serialized as null
      return { value: v, kind: 'type' }
    default:
      node[k] = { nested: node[k], [rng.pick(WEIRD_STRINGS)]: 1 }
      return { value: v, kind: 'extra' }
  }
}

function fillPath(path: string, rng: Rng, target: Target): string {
  return path.replace(/\{[^}]+\}/g, () =>
    encodeURIComponent(
      target.ids.length > 0 && rng.chance(0.6)
        ? rng.pick(target.ids)
        : rng.pick([
            'x',
            'file_0',
            'batch_0',
            'key_0',
            '..',
            '%2e%2e',
            'Ж',
            'a'.repeat(2000),
            '0'.repeat(40),
          ]),
    ),
  )
}

function queryFor(op: Operation, rng: Rng): string {
  const q = op.params.filter((p) => p.in === 'query')
  const parts: string[] = []
  for (const p of q) {
    if (!rng.chance(0.5)) continue
    const v = rng.pick([
      '1',
      '0',
      '-1',
      '1000000',
      'abc',
      '',
      '1.5',
      'active',
      'batch',
      '9'.repeat(30),
      'Ж',
      '%',
    ])
    parts.push(`${p.name}=${encodeURIComponent(v)}`)
  }
  if (rng.chance(0.15))
    parts.push(`${rng.pick(['limit', 'after', 'x', '__proto__'])}=${'q'.repeat(rng.pick([1, 4000]))}`)
  if (rng.chance(0.05)) parts.push('limit=1&limit=2')
  if (rng.chance(0.03)) parts.push('%zz=%')
  return parts.length > 0 ? `?${parts.join('&')}` : ''
}

/** Duplicates a top-level key in JSON text: the last one wins in JSON.parse. */
function duplicateKey(text: string, rng: Rng): string {
  if (!text.startsWith('{') || text === '{}') return text
  const key = rng.pick(['model', 'messages', 'input', 'name', 'stream', 'max_tokens'])
  return `{"${key}":${rng.pick(['1', 'null', '"x"', '[]'])},${text.slice(1)}`
}

function multipart(rng: Rng): { body: Uint8Array<ArrayBuffer>; type: string; kind: string } {
  const boundary = `----fuzz${rng.int(0, 1e9)}`
  const line =
    '{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"test/chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2}}\n'
  const name = rng.pick(['in.jsonl', 'a\r\nb.jsonl', 'Ж.jsonl', '../../x', '', 'x'.repeat(500)])
  let text =
    `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n${rng.pick(['batch', 'fine-tune', ''])}\r\n` +
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${name}"\r\nContent-Type: application/jsonl\r\n\r\n` +
    `${line.repeat(rng.int(0, 3))}\r\n--${boundary}--\r\n`
  const m = rng.int(0, 5)
  let type = `multipart/form-data; boundary=${boundary}`
  let kind = 'multipart'
  if (m === 0) {
    text = text.slice(0, rng.int(0, text.length))
    kind = 'multipart-truncated'
  } else if (m === 1) {
    type = 'multipart/form-data'
    kind = 'multipart-no-boundary'
  } else if (m === 2) {
    type = `multipart/form-data; boundary=other`
    kind = 'multipart-wrong-boundary'
  } else if (m === 3) {
    text = text.replaceAll('\r\n', '\n')
    kind = 'multipart-bare-lf'
  }
  return { body: new TextEncoder().encode(text), type, kind }
}

/** The next request: an operation from the document, a value from its schema, then mutations. */
export function nextRequest(ops: Operation[], rng: Rng, target: Target): FuzzRequest & { cred: Credential } {
  const op = rng.pick(ops)
  const cred: Credential = rng.chance(0.7)
    ? op.path.includes('/admin/')
      ? 'admin'
      : op.path.includes('/keys') || op.path.includes('/organization') || op.path.includes('/usage')
        ? 'master'
        : 'api'
    : rng.pick(['api', 'master', 'admin', 'none', 'bogus'] as const)
  const headers: Record<string, string> = {}
  let method = op.method
  if (rng.chance(0.04)) method = rng.pick(METHODS)
  let path = fillPath(op.path, rng, target) + queryFor(op, rng)
  if (rng.chance(0.02))
    path = rng.pick([
      '/v1/unknown',
      '/v1//chat/completions',
      '/v1/chat/completions/',
      '/%',
      '/v1/files/../keys',
    ])
  let kind = 'valid'
  let body: string | Uint8Array<ArrayBuffer> | undefined
  if (op.path === '/v1/files' && method === 'POST') {
    const mp = multipart(rng)
    headers['content-type'] = mp.type
    body = mp.body
    kind = mp.kind
  } else if (op.body && method !== 'GET' && method !== 'HEAD') {
    let value = sampleOf(op.body, rng, target)
    const rounds = rng.chance(0.75) ? rng.int(1, 3) : 0
    for (let i = 0; i < rounds; i++) {
      const r = mutateValue(value, rng)
      value = r.value
      if (r.kind !== 'none') kind = r.kind
    }
    let text = spliceDeep(JSON.stringify(value) ?? 'null')
    const raw = rng.int(0, 19)
    if (raw === 0) {
      text = text.slice(0, rng.int(0, text.length))
      kind = 'truncated'
    } else if (raw === 1) {
      text = duplicateKey(text, rng)
      kind = 'duplicate-key'
    } else if (raw === 2) {
      text = rng.pick(['', 'null', '[]', '"s"', '1', '{', '{"a":}', '\ufeff{}', '{"a":1}garbage', '[[[[[[[['])
      kind = 'raw'
    }
    headers['content-type'] = 'application/json'
    if (rng.chance(0.05)) {
      headers['content-type'] = rng.pick(CONTENT_TYPES)
      kind = 'content-type'
    }
    body = text
  }
  return { method, path, headers, ...(body !== undefined && { body }), kind, cred }
}
