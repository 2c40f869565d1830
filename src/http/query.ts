import { InvalidValue } from '../errors.ts'

/** An optional integer query parameter within bounds; 400 naming the parameter otherwise. */
export function queryInt(
  value: string | undefined,
  param: string,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
) {
  if (value === undefined) return undefined
  const n = Number(value)
  if (!/^-?\d+$/.test(value) || n < min || n > max)
    throw new InvalidValue(
      `${param} must be an integer from ${min}${max === Number.MAX_SAFE_INTEGER ? '' : ` to ${max}`}`,
      param,
    )
  return n
}

/** An optional query parameter from a fixed set. */
export function queryEnum<const T extends string>(
  value: string | undefined,
  param: string,
  options: readonly T[],
) {
  if (value === undefined) return undefined
  if (!(options as readonly string[]).includes(value))
    throw new InvalidValue(`${param} must be one of ${options.join(', ')}`, param)
  return value as T
}
