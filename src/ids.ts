// Identifiers: time-sortable ids for records, random base62 secrets for keys.
const CROCKFORD = '0123456789abcdefghjkmnpqrstvwxyz'
const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'

let lastMs = -1
let lastRandom = new Uint8Array(10)

/** A lowercase ULID-like id (26 chars): 48-bit time then 80 random bits, monotonic within a ms. */
export function sortableId(now = Date.now()): string {
  if (now <= lastMs) {
    // Same millisecond: increment the random part so ids stay strictly sortable.
    for (let i = lastRandom.length - 1; i >= 0; i--) {
      lastRandom[i] = (lastRandom[i]! + 1) & 0xff
      if (lastRandom[i] !== 0) break
    }
    now = lastMs
  } else {
    lastRandom = crypto.getRandomValues(new Uint8Array(10))
    lastMs = now
  }
  let out = ''
  let t = now
  for (let i = 0; i < 10; i++) {
    out = CROCKFORD[t % 32]! + out
    t = Math.floor(t / 32)
  }
  // 80 bits -> 16 chars of 5 bits
  let bits = 0n
  for (const b of lastRandom) bits = (bits << 8n) | BigInt(b)
  let rand = ''
  for (let i = 0; i < 16; i++) {
    rand = CROCKFORD[Number(bits & 31n)]! + rand
    bits >>= 5n
  }
  return out + rand
}

/** `len` random base62 characters from a CSPRNG (rejection sampling keeps them uniform). */
export function randomBase62(len: number): string {
  let out = ''
  while (out.length < len) {
    for (const b of crypto.getRandomValues(new Uint8Array(len * 2))) {
      if (b < 248) out += BASE62[b % 62]
      if (out.length === len) break
    }
  }
  return out
}

let prefixMs = -1
const BASE62_CODES = Array.from(BASE62, (c) => c.charCodeAt(0))
const prefixCodes = new Uint8Array(8)
const idCodes = new Uint8Array(24)
// ASCII only, so 'latin1' (windows-1252 to WHATWG) decodes each byte to the same character.
const ascii = new TextDecoder('latin1')
const pool = new Uint8Array(4096)
let poolAt = pool.length

/**
 * A request or completion id (not secret, only unique): 24 base62 characters, the first 8 the
 * time in ms, then 16 random. Time first keeps ledger rows (keyed by request id) appending at the
 * end of the index instead of landing at random pages: a quarter of the write cost per row.
 */
export function requestId(nowMs = Date.now()): string {
  if (nowMs !== prefixMs) {
    prefixMs = nowMs
    let t = nowMs
    for (let i = 7; i >= 0; i--) {
      prefixCodes[i] = BASE62_CODES[t % 62]!
      t = Math.floor(t / 62)
    }
  }
  idCodes.set(prefixCodes)
  // One id per request: random bytes come from the CSPRNG 4 KiB at a time (an id is unique, not
  // secret), and the characters become one flat string at once, not 24 concatenations.
  let n = 8
  while (n < 24) {
    if (poolAt === pool.length) {
      crypto.getRandomValues(pool)
      poolAt = 0
    }
    const b = pool[poolAt++]!
    if (b < 248) idCodes[n++] = BASE62_CODES[b % 62]!
  }
  return ascii.decode(idCodes)
}
