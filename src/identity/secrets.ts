import { randomBase62 } from '../ids.ts'

export type SecretKind = 'sk' | 'mk'

const SECRET = /^(sk|mk)-[0-9A-Za-z]{43}$/

/** A new secret: `sk-` (API key) or `mk-` (master key) then 43 base62 characters. */
export function newSecret(kind: SecretKind): string {
  return `${kind}-${randomBase62(43)}`
}

/** Secrets are stored and looked up only as SHA-256 hex. */
export function hashSecret(secret: string): string {
  return new Bun.CryptoHasher('sha256').update(secret).digest('hex')
}

/** `sk-…abcd`: enough to recognise a key in a list, never enough to use it. */
export function secretHint(secret: string): string {
  return `${secret.slice(0, 3)}…${secret.slice(-4)}`
}

export function looksLikeSecret(token: string): boolean {
  return SECRET.test(token)
}
