import { customType } from 'drizzle-orm/sqlite-core'
import type { Budget } from '../../billing/budgets.ts'
import { budgetFromText, budgetToText } from '../records.ts'

// bun:sqlite is opened with safeIntegers, so every INTEGER arrives as a bigint. Drizzle's own
// integer columns assume plain numbers; these helpers say which INTEGER is which.

/** Money in nano-roubles: INTEGER in SQL (so SQL can add and compare it), bigint in TypeScript. */
export const money = customType<{ data: bigint; driverData: bigint | number }>({
  dataType: () => 'integer',
  fromDriver: (v) => BigInt(v),
  toDriver: (v) => v,
})

/** A count (tokens, limits) that always fits in a JS number. */
export const count = customType<{ data: number; driverData: bigint | number }>({
  dataType: () => 'integer',
  fromDriver: (v) => Number(v),
  toDriver: (v) => v,
})

/** Unix time (seconds or milliseconds, as the column name says). */
export const epoch = count

/** A period budget as JSON text (the amount a decimal string: exact past 2^53). */
export const budget = customType<{ data: Budget; driverData: string }>({
  dataType: () => 'text',
  toDriver: budgetToText,
  fromDriver: budgetFromText,
})
