/** How deep any JSON Tropa accepts may nest: request bodies and batch lines alike. */

/**
 * Arrays and objects nested deeper than this are refused before JSON.parse sees the text.
 * Parsing 20,000 levels costs the event loop ~35 ms and serializing them overflows the stack;
 * real requests (tool parameter schemas included) stay far below 64.
 */
export const MAX_JSON_DEPTH = 64

/**
 * Whether the JSON text opens more than `max` arrays or objects at once. One pass, skipping
 * strings with indexOf, so it costs a fraction of JSON.parse on ordinary bodies; malformed text
 * is left to JSON.parse.
 */
export function nestedDeeperThan(text: string, max: number): boolean {
  let depth = 0
  const n = text.length
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i)
    if (c === 0x22) {
      // Skip to the closing quote: one not preceded by an odd number of backslashes.
      for (;;) {
        const q = text.indexOf('"', i + 1)
        if (q < 0) return false
        let b = q - 1
        while (text.charCodeAt(b) === 0x5c) b--
        i = q
        if ((q - 1 - b) % 2 === 0) break
      }
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true
    } else if (c === 0x5d || c === 0x7d) depth--
  }
  return false
}
