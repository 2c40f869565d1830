import { isIP } from 'node:net'
import { InvalidValue } from '../errors.ts'

/** Longest webhook URL accepted. */
export const MAX_URL_LENGTH = 2048

/**
 * A webhook URL as stored: absolute http(s), no credentials, no fragment; unless private
 * addresses are allowed (webhooks.allow_private_urls), not a loopback, private or link-local
 * address literal nor `localhost` (names are checked again when delivering, see privateAddress).
 */
export function webhookUrl(raw: string, allowPrivate: boolean): string {
  let u: URL
  try {
    u = new URL(raw)
  } catch {
    throw new InvalidValue('url must be an absolute http or https URL', 'url')
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw new InvalidValue('url must be an http or https URL', 'url')
  if (u.username || u.password) throw new InvalidValue('url must not carry a user name or password', 'url')
  if (u.hash) throw new InvalidValue('url must not have a fragment', 'url')
  const host = u.hostname.replace(/^\[|\]$/g, '')
  if (!allowPrivate && (host === 'localhost' || host.endsWith('.localhost') || privateAddress(host)))
    throw new InvalidValue(
      'url names a loopback or private address; Tropa posts webhooks to public addresses only (webhooks.allow_private_urls lifts this)',
      'url',
    )
  return u.href
}

/** Whether an IP address literal is loopback, private, link-local, shared or unspecified. */
export function privateAddress(ip: string): boolean {
  const kind = isIP(ip)
  if (kind === 4) {
    const [a = 0, b = 0] = ip.split('.').map(Number)
    return (
      a === 0 ||
      a === 10 ||
      a === 127 ||
      (a === 100 && b >= 64 && b <= 127) ||
      (a === 169 && b === 254) ||
      (a === 172 && b >= 16 && b <= 31) ||
      (a === 192 && b === 168)
    )
  }
  if (kind === 6) {
    const v = ip.toLowerCase()
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(v)
    if (mapped) return privateAddress(mapped[1]!)
    // The same mapped address as URL parsing writes it (::ffff:7f00:1 for 127.0.0.1).
    const hex = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(v)
    if (hex) {
      const hi = Number.parseInt(hex[1]!, 16)
      const lo = Number.parseInt(hex[2]!, 16)
      return privateAddress(`${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`)
    }
    return v === '::' || v === '::1' || /^f[cd]/.test(v) || /^fe[89ab]/.test(v)
  }
  return false
}
