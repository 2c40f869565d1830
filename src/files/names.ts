/** Bytes of UTF-8 a stored file name may take (a common file system's limit for one name). */
export const MAX_FILENAME_BYTES = 255
const FALLBACK = 'upload.jsonl'

// C0 and C1 controls, DEL, and the invisible marks that reorder text (a name "gpj.exe" shown as "exe.jpg").
const CONTROLS = /[\p{Cc}\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]/gu

/**
 * A client's file name as Tropa stores it: its last path segment, without control characters,
 * at most MAX_FILENAME_BYTES of UTF-8 (cut between characters), never empty.
 */
export function sanitizeFilename(raw: string | undefined | null): string {
  if (!raw) return FALLBACK
  let name = raw.toWellFormed().normalize('NFC').replace(CONTROLS, '')
  name = (name.split(/[/\\]/).pop() ?? '').trim()
  if (name === '' || name === '.' || name === '..') return FALLBACK
  if (Buffer.byteLength(name) > MAX_FILENAME_BYTES) {
    let out = ''
    let bytes = 0
    for (const ch of name) {
      const n = Buffer.byteLength(ch)
      if (bytes + n > MAX_FILENAME_BYTES) break
      out += ch
      bytes += n
    }
    name = out.trim() || FALLBACK
  }
  return name
}

/**
 * `Content-Disposition: attachment` for a file name per RFC 6266: an ASCII `filename` for old
 * clients (anything else replaced by `_`) and the exact name as UTF-8 in `filename*` (RFC 8187).
 * Safe for any stored name, even one stored before names were sanitized.
 */
export function contentDisposition(name: string): string {
  const clean = name.toWellFormed().replace(CONTROLS, '')
  const ascii = clean.replace(/[^\x20-\x7e]|["\\%]/g, '_')
  // encodeURIComponent leaves ' ( ) * unescaped, which RFC 8187's attr-char does not allow.
  const exact = encodeURIComponent(clean).replace(
    /['()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  )
  return `attachment; filename="${ascii}"; filename*=UTF-8''${exact}`
}
