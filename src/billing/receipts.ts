// Receipts: what a billed request was charged, signed with Ed25519 (docs/api.md, "Receipts").
// A receipt is a compact JWS (RFC 7515) with alg EdDSA (RFC 8037): any JOSE library, or WebCrypto
// by hand, verifies it with the public keys at /.well-known/tropa-receipts.json. Its bytes are a
// pure function of the ledger row and the key id, and Ed25519 signatures are deterministic, so an
// export re-signs a row into the very receipt its response carried.

/** The response header (non-streamed answers) carrying the receipt. */
export const RECEIPT_HEADER = 'x-tropa-receipt'

/** What a receipt says: the fields of the request's ledger row that the customer was billed by. */
export interface ReceiptClaims {
  readonly requestId: string
  readonly orgId: string
  readonly keyId: string
  readonly model: string
  readonly promptTokens: number
  /** Prompt tokens billed at the cached price; 0 when the upstream reported none. */
  readonly cachedTokens: number
  readonly completionTokens: number
  /** The charge, nano-roubles. */
  readonly costNano: bigint
  /** When the request was settled (its ledger row's ended_at_ms). */
  readonly endedAtMs: number
}

/** The receipt's payload as a customer reads it (the JSON inside the JWS). */
export interface ReceiptPayload {
  readonly v: 1
  readonly request_id: string
  readonly org_id: string
  readonly key_id: string
  readonly model: string
  readonly prompt_tokens: number
  readonly cached_tokens: number
  readonly completion_tokens: number
  /** Decimal text: nano-roubles do not fit a JSON number exactly past 2^53. */
  readonly cost_nano: string
  readonly ended_at_ms: number
}

/**
 * A count as the ledger stores it (storage/ledger-rows.ts): a whole number from 0 to 2^31-1, else
 * 0, so the receipt signed at settlement and the one re-signed from the row say the same.
 */
export const receiptCount = (v: number | null | undefined): number =>
  typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 && v <= 0x7fffffff ? v : 0

const b64url = (bytes: Uint8Array | string): string =>
  (typeof bytes === 'string'
    ? Buffer.from(bytes)
    : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length)
  ).toString('base64url')

/** The JWS's protected header, base64url: `{"alg":"EdDSA","kid":"<kid>"}`. */
export function receiptHeader(kid: string): string {
  return b64url(`{"alg":"EdDSA","kid":${JSON.stringify(kid)}}`)
}

/** The payload's JSON text, its members always in this order. */
export function receiptPayloadJson(c: ReceiptClaims): string {
  return `{"v":1,"request_id":${JSON.stringify(c.requestId)},"org_id":${JSON.stringify(c.orgId)},"key_id":${JSON.stringify(c.keyId)},"model":${JSON.stringify(c.model)},"prompt_tokens":${receiptCount(c.promptTokens)},"cached_tokens":${receiptCount(c.cachedTokens)},"completion_tokens":${receiptCount(c.completionTokens)},"cost_nano":"${c.costNano}","ended_at_ms":${Math.trunc(c.endedAtMs)}}`
}

/** The bytes signed: `<header>.<payload>`, both base64url (the JWS signing input). */
export function receiptSigningInput(kid: string, c: ReceiptClaims): string {
  return `${receiptHeader(kid)}.${b64url(receiptPayloadJson(c))}`
}

/** One JWK of /.well-known/tropa-receipts.json. */
export interface ReceiptJwk {
  readonly kty: 'OKP'
  readonly crv: 'Ed25519'
  /** The raw public key, base64url. */
  readonly x: string
  readonly kid: string
  readonly alg: 'EdDSA'
  readonly use: 'sig'
  /** Unix seconds. */
  readonly created_at: number
}

/** /.well-known/tropa-receipts.json: every key ever used (old receipts stay verifiable), and the current one. */
export interface ReceiptKeySet {
  readonly keys: readonly ReceiptJwk[]
  readonly current_kid: string | null
}

export type ReceiptCheck =
  | { readonly ok: true; readonly kid: string; readonly payload: ReceiptPayload }
  | { readonly ok: false; readonly reason: string }

const B64URL = /^[A-Za-z0-9_-]*$/

/**
 * Verifies a receipt with WebCrypto (a standard Ed25519 implementation) against a key set; on
 * success returns its payload. Verifying the signature is all a receipt needs: the payload is
 * what was signed, byte for byte.
 */
export async function verifyReceipt(jws: string, keys: ReceiptKeySet): Promise<ReceiptCheck> {
  const parts = jws.split('.')
  if (parts.length !== 3 || !parts.every((p) => B64URL.test(p)))
    return { ok: false, reason: 'not a compact JWS' }
  const [h, p, s] = parts as [string, string, string]
  let header: { alg?: unknown; kid?: unknown }
  try {
    header = JSON.parse(Buffer.from(h, 'base64url').toString('utf8'))
  } catch {
    return { ok: false, reason: 'its header is not JSON' }
  }
  if (header.alg !== 'EdDSA') return { ok: false, reason: `alg is ${String(header.alg)}, not EdDSA` }
  const jwk = keys.keys.find((k) => k.kid === header.kid)
  if (!jwk) return { ok: false, reason: `no published key has kid ${String(header.kid)}` }
  const sig = Buffer.from(s, 'base64url')
  if (sig.length !== 64) return { ok: false, reason: 'the signature is not 64 bytes' }
  let valid: boolean
  try {
    const key = await crypto.subtle.importKey(
      'jwk',
      { kty: 'OKP', crv: 'Ed25519', x: jwk.x },
      { name: 'Ed25519' },
      false,
      ['verify'],
    )
    valid = await crypto.subtle.verify({ name: 'Ed25519' }, key, sig, new TextEncoder().encode(`${h}.${p}`))
  } catch (err) {
    return { ok: false, reason: `the key ${jwk.kid} cannot verify: ${(err as Error).message}` }
  }
  if (!valid) return { ok: false, reason: 'the signature does not match' }
  try {
    return { ok: true, kid: jwk.kid, payload: JSON.parse(Buffer.from(p, 'base64url').toString('utf8')) }
  } catch {
    return { ok: false, reason: 'its payload is not JSON' }
  }
}
