/**
 * Money is `bigint` nano-roubles everywhere inside Tropa. This module is the only place that
 * converts between nano-roubles and decimal text or JSON numbers.
 */
export type NanoRub = bigint

export const NANO_PER_RUB = 1_000_000_000n
/** One micro-rouble: prices and limits are whole multiples of it (six fractional digits). */
export const NANO_PER_MICRO = 1_000n

/**
 * The largest amount Tropa takes (a limit, a balance, a credit) and the largest balance an
 * organization can reach: one billion roubles. Both stores keep money in signed 64-bit integers
 * (at most about 9.2 billion roubles), so every sum of such amounts stays exact.
 */
export const MAX_AMOUNT_RUB = 1_000_000_000
export const MAX_AMOUNT_NANO = BigInt(MAX_AMOUNT_RUB) * NANO_PER_RUB

const DECIMAL = /^(\d+)(?:\.(\d+))?$/

/**
 * Parses a non-negative decimal rouble amount ("12.5", "0.000030") into nano-roubles.
 * Returns undefined when the text is not a plain decimal or has more than `maxFractionDigits`
 * fractional digits (so a value is never silently rounded).
 */
export function parseRub(text: string, maxFractionDigits = 9): NanoRub | undefined {
  const m = DECIMAL.exec(text.trim())
  if (!m) return undefined
  const frac = (m[2] ?? '').replace(/0+$/, '')
  if (frac.length > maxFractionDigits) return undefined
  return BigInt(m[1]!) * NANO_PER_RUB + BigInt(frac.padEnd(9, '0'))
}

/** A JSON number of roubles (at most six fractional digits) to nano-roubles; undefined if not exact. */
export function rubNumberToNano(value: number): NanoRub | undefined {
  if (!Number.isFinite(value) || value < 0) return undefined
  // toFixed(6) rounds; accept only when it round-trips, i.e. the number had <= 6 digits.
  const fixed = value.toFixed(6)
  if (Number(fixed) !== value) return undefined
  return parseRub(fixed, 6)
}

/** Roubles per million tokens (the unit people quote) to nano-roubles per token, if exact at 6 digits. */
export function perMillionToPerTokenNano(text: string): NanoRub | undefined {
  const perMillion = parseRub(text, 9)
  if (perMillion === undefined) return undefined
  if (perMillion % (1_000_000n * NANO_PER_MICRO) !== 0n) return undefined
  return perMillion / 1_000_000n
}

const POW10 = Array.from({ length: 10 }, (_, i) => 10n ** BigInt(i))

/** Below this (about 8,796 roubles), formatRub's six-digit text is computed in doubles, exactly. */
const FAST_FORMAT_LIMIT = 2n ** 43n

/** Nano-roubles as decimal text with exactly `digits` (0-9) fractional digits, rounding half up. */
export function formatRub(nano: NanoRub, digits = 6): string {
  // A request's cost, shown on every response: an integer below 2^43 is exact in a double, and the
  // two divisions below stay within 1e-6 of the true quotient, so floor() gives the same digits as
  // the bigint arithmetic of the general case at a third of its cost.
  if (digits === 6 && nano >= 0n && nano < FAST_FORMAT_LIMIT) {
    const micro = Math.floor((Number(nano) + 500) / 1000)
    const whole = Math.floor(micro / 1e6)
    return `${whole}.${String(micro - whole * 1e6 + 1e6).slice(1)}`
  }
  return formatRubExact(nano, digits)
}

/** formatRub's general case, in bigint arithmetic. */
export function formatRubExact(nano: NanoRub, digits = 6): string {
  const negative = nano < 0n
  let abs = negative ? -nano : nano
  if (digits < 9) {
    const unit = POW10[9 - digits]!
    abs = (abs + unit / 2n) / unit
  }
  // One bigint-to-text conversion, then the decimal point goes in by string slicing.
  const text = abs.toString().padStart(digits + 1, '0')
  const cut = text.length - digits
  return `${negative ? '-' : ''}${text.slice(0, cut)}${digits > 0 ? `.${text.slice(cut)}` : ''}`
}

/** The JSON number shown for an amount (`limit_rub`, `spent_rub`, ...): six fractional digits at most. */
export function nanoToRubNumber(nano: NanoRub): number {
  // Rounded to whole micro-roubles (half up, as formatRub), then one correctly rounded division:
  // the same double as parsing formatRub's text, without building it.
  const negative = nano < 0n
  const micro = ((negative ? -nano : nano) + 500n) / 1000n
  if (micro > MAX_SAFE_MICRO) return Number(formatRub(nano, 6))
  const rub = Number(micro) / 1e6
  return negative ? -rub : rub
}

const MAX_SAFE_MICRO = BigInt(Number.MAX_SAFE_INTEGER)

/** Cost of a request: tokens times per-token prices. */
export function costNano(
  promptTokens: number,
  completionTokens: number,
  price: { promptNano: NanoRub; completionNano: NanoRub; cachedPromptNano?: NanoRub },
  /** Of the prompt tokens, those the upstream reported as cached (billed at cachedPromptNano). */
  cachedTokens = 0,
): NanoRub {
  const full = BigInt(promptTokens) * price.promptNano + BigInt(completionTokens) * price.completionNano
  // An upstream's figure: whatever it says, at most the prompt and never a fraction or NaN.
  if (
    !(cachedTokens > 0) ||
    price.cachedPromptNano === undefined ||
    price.cachedPromptNano === price.promptNano
  )
    return full
  const cached = BigInt(Math.floor(Math.min(cachedTokens, promptTokens)))
  return full - cached * (price.promptNano - price.cachedPromptNano)
}

/** Batch lines cost half. Prices are whole micro-roubles, so half is exact in nano-roubles. */
export function batchCostNano(fullCost: NanoRub): NanoRub {
  return fullCost / 2n
}
