import type { LedgerEntry } from './records.ts'

/** Strings of a row, as indices into the batch's table of strings (-1 is null). */
const REF_KIND = 0
const REF_ORG = 1
const REF_KEY = 2
const REF_MODEL = 3
const REF_NODE = 4
const REF_BATCH = 5
const REF_OUTCOME = 6
const REF_END_USER = 7
const REF_RECEIPT = 8
const REFS = 9
/** Numbers of a row. */
const NUM_PROMPT = 0
const NUM_COMPLETION = 1
const NUM_STARTED = 2
const NUM_ENDED = 3
/** NaN is null (not reported). */
const NUM_CACHED = 4
const NUM_TTFT = 5
/** NaN is null (a key without a period budget). */
const NUM_ADMITTED = 6
const NUMS = 7

/** The ledger's columns in the order `LedgerRows.bind` puts a row's values. */
export const LEDGER_COLUMN_NAMES = [
  'request_id',
  'kind',
  'org_id',
  'key_id',
  'model',
  'node',
  'prompt_tokens',
  'completion_tokens',
  'cost_nano',
  'batch_id',
  'started_at_ms',
  'ended_at_ms',
  'outcome',
  'estimated',
  'cached_tokens',
  'ttft_ms',
  'end_user',
  'admitted_at_ms',
  'receipt_kid',
] as const
export const LEDGER_COLUMNS = LEDGER_COLUMN_NAMES.length

export type SqlValue = string | number | bigint | null

/** A row's own fields: everything but what the settling side adds (see LedgerRows.pushRow). */
export type LedgerRowBase = Omit<LedgerEntry, 'kind' | 'orgId' | 'keyId' | 'costNano' | 'outcome'>

const strAt = (strings: readonly string[], ref: number): string | null => (ref < 0 ? null : strings[ref]!)
const numOrNull = (n: number): number | null => (Number.isNaN(n) ? null : n)
/**
 * An optional count as stored: a whole number from 0 to 2^31-1 (PostgreSQL's integer), else NaN
 * (null). Cached tokens come from the upstream: a value out of range must not fail a flush.
 */
const countOrNaN = (v: number | null | undefined): number =>
  typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 && v <= 0x7fffffff ? v : Number.NaN

/** LedgerRows as plain data for postMessage: a few typed arrays, the strings and the request ids. */
export interface LedgerRowsWire {
  readonly n: number
  /** The request ids' UTF-16 code units end to end... */
  readonly idChars: Uint16Array
  /** ...and where each ends. */
  readonly idEnds: Uint32Array
  readonly strings: string[]
  readonly refs: Int32Array
  readonly nums: Float64Array
  readonly costs: BigInt64Array
  readonly estimated: Uint8Array
}

const utf16 = new TextDecoder('utf-16le')
const INT64_MIN = -(2n ** 63n)
const INT64_MAX = 2n ** 63n - 1n

/**
 * Ledger rows waiting to be written, held in columns. A settled request adds its numbers to
 * typed arrays and its organization, key, model, node and outcome as indices into a small table
 * of strings (they repeat from row to row), so no object per request waits for the flush, and a
 * flush crosses to the ledger thread as a few copied arrays instead of JSON text.
 */
export class LedgerRows {
  private n = 0
  /**
   * The request ids, copied in as code units, so the queue holds no string of a request: held
   * until the flush (up to 250 ms by default), a request's id string would outlive the young
   * collections that free it otherwise and wait for a full one.
   */
  private idChars: Uint16Array
  private idEnds: Uint32Array
  private idEnd = 0
  /** All ids as one string, decoded when an id is first read (the ledger thread's bind). */
  private idText: string | undefined
  private strings: string[] = []
  private readonly index = new Map<string, number>()
  private refs: Int32Array
  private nums: Float64Array
  private costs: BigInt64Array
  private estimated: Uint8Array

  constructor(capacity = 256) {
    const cap = Math.max(1, capacity)
    this.refs = new Int32Array(cap * REFS)
    this.nums = new Float64Array(cap * NUMS)
    this.costs = new BigInt64Array(cap)
    this.estimated = new Uint8Array(cap)
    this.idEnds = new Uint32Array(cap)
    this.idChars = new Uint16Array(cap * 32)
  }

  static of(entries: readonly LedgerEntry[]): LedgerRows {
    const rows = new LedgerRows(entries.length)
    for (const e of entries) rows.push(e)
    return rows
  }

  get length(): number {
    return this.n
  }

  push(e: LedgerEntry): void {
    this.pushRow(e, e.kind, e.orgId, e.keyId, e.costNano, e.outcome, e.admittedAtMs ?? undefined)
  }

  /**
   * A row from a settlement and the fields it lacks, given apart so that settling a request
   * builds no entry object only for its fields to be copied here (charge() in meter.ts).
   */
  pushRow(
    s: LedgerRowBase,
    kind: LedgerEntry['kind'],
    orgId: string,
    keyId: string | null,
    costNano: bigint,
    outcome: string,
    /** When the request was admitted, for a key with a period budget. */
    admittedAtMs?: number,
  ): void {
    // Checked before anything is written, so a refused row leaves the columns as they were.
    // Money is kept within signed 64 bits everywhere (MAX_AMOUNT_NANO); a wider value is a bug.
    if (typeof costNano !== 'bigint' || costNano < INT64_MIN || costNano > INT64_MAX)
      throw new RangeError(`ledger amount not a 64-bit bigint: ${costNano}`)
    // The ledger's NOT NULL columns: a row without them would be skipped by the INSERT.
    if (typeof s.requestId !== 'string' || typeof orgId !== 'string' || typeof outcome !== 'string')
      throw new TypeError('a ledger row needs a request id, an organization and an outcome')
    const i = this.n
    if (i === this.costs.length) this.grow(Math.max(16, i * 2))
    const r = i * REFS
    const refs = this.refs
    refs[r + REF_KIND] = this.ref(kind)
    refs[r + REF_ORG] = this.ref(orgId)
    refs[r + REF_KEY] = this.ref(keyId)
    refs[r + REF_MODEL] = this.ref(s.model)
    refs[r + REF_NODE] = this.ref(s.node)
    refs[r + REF_BATCH] = this.ref(s.batchId)
    refs[r + REF_OUTCOME] = this.ref(outcome)
    refs[r + REF_END_USER] = this.ref(s.endUser ?? null)
    refs[r + REF_RECEIPT] = this.ref(s.receiptKid ?? null)
    const m = i * NUMS
    this.nums[m + NUM_PROMPT] = s.promptTokens
    this.nums[m + NUM_COMPLETION] = s.completionTokens
    this.nums[m + NUM_STARTED] = s.startedAtMs
    this.nums[m + NUM_ENDED] = s.endedAtMs
    this.nums[m + NUM_CACHED] = countOrNaN(s.cachedTokens)
    this.nums[m + NUM_TTFT] = countOrNaN(s.ttftMs)
    this.nums[m + NUM_ADMITTED] = admittedAtMs ?? Number.NaN
    this.costs[i] = costNano
    this.estimated[i] = s.estimated ? 1 : 0
    const id = s.requestId
    const from = this.idEnd
    const to = from + id.length
    if (to > this.idChars.length) {
      const chars = new Uint16Array(Math.max(to, this.idChars.length * 2))
      chars.set(this.idChars)
      this.idChars = chars
    }
    const chars = this.idChars
    for (let k = 0; k < id.length; k++) chars[from + k] = id.charCodeAt(k)
    this.idEnds[i] = to
    this.idEnd = to
    this.idText = undefined
    this.n = i + 1
  }

  /** Empties the rows, keeping the arrays for the next batch. */
  clear(): void {
    this.n = 0
    this.idEnd = 0
    this.idText = undefined
    this.strings = []
    this.index.clear()
  }

  /** Appends every row of `other` (a failed flush's rows go back in front of newer ones). */
  append(other: LedgerRows): void {
    for (let i = 0; i < other.n; i++) this.push(other.entry(i))
  }

  requestId(i: number): string {
    this.idText ??= utf16.decode(this.idChars.subarray(0, this.idEnd))
    return this.idText.slice(i === 0 ? 0 : this.idEnds[i - 1]!, this.idEnds[i]!)
  }
  kind(i: number): 'usage' | 'credit' {
    return this.str(i, REF_KIND) as 'usage' | 'credit'
  }
  orgId(i: number): string {
    return this.str(i, REF_ORG)!
  }
  keyId(i: number): string | null {
    return this.str(i, REF_KEY)
  }
  model(i: number): string | null {
    return this.str(i, REF_MODEL)
  }
  node(i: number): string | null {
    return this.str(i, REF_NODE)
  }
  batchId(i: number): string | null {
    return this.str(i, REF_BATCH)
  }
  outcome(i: number): string {
    return this.str(i, REF_OUTCOME)!
  }
  receiptKid(i: number): string | null {
    return this.str(i, REF_RECEIPT)
  }
  promptTokens(i: number): number {
    return this.nums[i * NUMS + NUM_PROMPT]!
  }
  completionTokens(i: number): number {
    return this.nums[i * NUMS + NUM_COMPLETION]!
  }
  startedAtMs(i: number): number {
    return this.nums[i * NUMS + NUM_STARTED]!
  }
  endedAtMs(i: number): number {
    return this.nums[i * NUMS + NUM_ENDED]!
  }
  cachedTokens(i: number): number | null {
    return numOrNull(this.nums[i * NUMS + NUM_CACHED]!)
  }
  ttftMs(i: number): number | null {
    return numOrNull(this.nums[i * NUMS + NUM_TTFT]!)
  }
  endUser(i: number): string | null {
    return this.str(i, REF_END_USER)
  }
  admittedAtMs(i: number): number | null {
    return numOrNull(this.nums[i * NUMS + NUM_ADMITTED]!)
  }
  costNano(i: number): bigint {
    return this.costs[i]!
  }
  isEstimated(i: number): boolean {
    return this.estimated[i] === 1
  }

  /** Puts row `i`'s values at `at` in `args`, in the order of LEDGER_COLUMN_NAMES (for an INSERT). */
  bind(args: SqlValue[], at: number, i: number): void {
    const refs = this.refs
    const strings = this.strings
    const nums = this.nums
    const r = i * REFS
    const m = i * NUMS
    args[at] = this.requestId(i)
    args[at + 1] = strAt(strings, refs[r + REF_KIND]!)
    args[at + 2] = strAt(strings, refs[r + REF_ORG]!)
    args[at + 3] = strAt(strings, refs[r + REF_KEY]!)
    args[at + 4] = strAt(strings, refs[r + REF_MODEL]!)
    args[at + 5] = strAt(strings, refs[r + REF_NODE]!)
    args[at + 6] = nums[m + NUM_PROMPT]!
    args[at + 7] = nums[m + NUM_COMPLETION]!
    args[at + 8] = this.costs[i]!
    args[at + 9] = strAt(strings, refs[r + REF_BATCH]!)
    args[at + 10] = nums[m + NUM_STARTED]!
    args[at + 11] = nums[m + NUM_ENDED]!
    args[at + 12] = strAt(strings, refs[r + REF_OUTCOME]!)
    args[at + 13] = this.estimated[i]!
    args[at + 14] = numOrNull(nums[m + NUM_CACHED]!)
    args[at + 15] = numOrNull(nums[m + NUM_TTFT]!)
    args[at + 16] = strAt(strings, refs[r + REF_END_USER]!)
    args[at + 17] = numOrNull(nums[m + NUM_ADMITTED]!)
    args[at + 18] = strAt(strings, refs[r + REF_RECEIPT]!)
  }

  entry(i: number): LedgerEntry {
    return {
      requestId: this.requestId(i),
      kind: this.kind(i),
      orgId: this.orgId(i),
      keyId: this.keyId(i),
      model: this.model(i),
      node: this.node(i),
      promptTokens: this.promptTokens(i),
      completionTokens: this.completionTokens(i),
      costNano: this.costNano(i),
      batchId: this.batchId(i),
      startedAtMs: this.startedAtMs(i),
      endedAtMs: this.endedAtMs(i),
      outcome: this.outcome(i),
      estimated: this.isEstimated(i),
      cachedTokens: this.cachedTokens(i),
      ttftMs: this.ttftMs(i),
      endUser: this.endUser(i),
      admittedAtMs: this.admittedAtMs(i),
      receiptKid: this.receiptKid(i),
    }
  }

  entries(): LedgerEntry[] {
    return Array.from({ length: this.n }, (_, i) => this.entry(i))
  }

  /** The rows for postMessage: the used part of each column (copied), and the strings. */
  toWire(): LedgerRowsWire {
    const n = this.n
    return {
      n,
      idChars: this.idChars.slice(0, this.idEnd),
      idEnds: this.idEnds.slice(0, n),
      strings: this.strings,
      refs: this.refs.slice(0, n * REFS),
      nums: this.nums.slice(0, n * NUMS),
      costs: this.costs.slice(0, n),
      estimated: this.estimated.slice(0, n),
    }
  }

  static fromWire(w: LedgerRowsWire): LedgerRows {
    const rows = new LedgerRows(0)
    rows.n = w.n
    rows.idChars = w.idChars
    rows.idEnds = w.idEnds
    rows.idEnd = w.idChars.length
    rows.strings = w.strings
    rows.refs = w.refs
    rows.nums = w.nums
    rows.costs = w.costs
    rows.estimated = w.estimated
    return rows
  }

  private str(i: number, col: number): string | null {
    return strAt(this.strings, this.refs[i * REFS + col]!)
  }

  private ref(s: string | null): number {
    if (s === null) return -1
    let ref = this.index.get(s)
    if (ref === undefined) {
      ref = this.strings.length
      this.strings.push(s)
      this.index.set(s, ref)
    }
    return ref
  }

  private grow(cap: number): void {
    const refs = new Int32Array(cap * REFS)
    refs.set(this.refs)
    this.refs = refs
    const nums = new Float64Array(cap * NUMS)
    nums.set(this.nums)
    this.nums = nums
    const costs = new BigInt64Array(cap)
    costs.set(this.costs)
    this.costs = costs
    const estimated = new Uint8Array(cap)
    estimated.set(this.estimated)
    this.estimated = estimated
    const idEnds = new Uint32Array(cap)
    idEnds.set(this.idEnds)
    this.idEnds = idEnds
  }
}

/** One organization's, key's and model's usage in one UTC hour (a row of usage_hours). */
export interface UsageHour {
  readonly orgId: string
  /** '' for none. */
  readonly keyId: string
  /** '' for none. */
  readonly model: string
  /** Unix seconds of the hour's start. */
  readonly hourStart: number
  requests: number
  promptTokens: number
  completionTokens: number
  cachedTokens: number
  costNano: bigint
}

const HOUR_MS = 3_600_000

/**
 * What written ledger rows move, summed per flush: each organization's balance (a usage row takes
 * its cost off, a credit adds it), each key's spend and last use, and the usage hours (usage rows
 * only). Both stores add the rows their INSERT actually wrote (not replays) and apply one UPDATE
 * (or upsert, for an hour) per entry: a flush of hundreds of rows touches a handful of hours.
 */
export class LedgerEffects {
  readonly orgs = new Map<string, bigint>()
  readonly keys = new Map<string, { spent: bigint; usedAt: number }>()
  readonly hours = new Map<string, UsageHour>()
  readonly byModel = new Map<string, UsageHour>()
  readonly byKey = new Map<string, UsageHour>()

  add(rows: LedgerRows, i: number): void {
    const orgId = rows.orgId(i)
    const cost = rows.costNano(i)
    const usage = rows.kind(i) === 'usage'
    this.orgs.set(orgId, (this.orgs.get(orgId) ?? 0n) + (usage ? -cost : cost))
    const keyId = rows.keyId(i)
    if (usage && keyId) {
      const k = this.keys.get(keyId) ?? { spent: 0n, usedAt: 0 }
      k.spent += cost
      k.usedAt = Math.max(k.usedAt, Math.floor(rows.endedAtMs(i) / 1000))
      this.keys.set(keyId, k)
    }
    if (!usage) return
    const hourStart = Math.floor(rows.endedAtMs(i) / HOUR_MS) * 3600
    const model = rows.model(i) ?? ''
    const key = keyId ?? ''
    // The row's own key and model, and the hour's sums per model (usage_hours_by_model, key '')
    // and per key (usage_hours_by_key, model '').
    addHour(this.hours, orgId, key, model, hourStart, rows, i, cost)
    addHour(this.byModel, orgId, '', model, hourStart, rows, i, cost)
    addHour(this.byKey, orgId, key, '', hourStart, rows, i, cost)
  }
}

function addHour(
  hours: Map<string, UsageHour>,
  orgId: string,
  keyId: string,
  model: string,
  hourStart: number,
  rows: LedgerRows,
  i: number,
  cost: bigint,
): void {
  const id = `${orgId}\n${keyId}\n${model}\n${hourStart}`
  let h = hours.get(id)
  if (h === undefined) {
    h = {
      orgId,
      keyId,
      model,
      hourStart,
      requests: 0,
      promptTokens: 0,
      completionTokens: 0,
      cachedTokens: 0,
      costNano: 0n,
    }
    hours.set(id, h)
  }
  h.requests++
  h.promptTokens += rows.promptTokens(i)
  h.completionTokens += rows.completionTokens(i)
  h.cachedTokens += rows.cachedTokens(i) ?? 0
  h.costNano += cost
}

/** The reasons given for credits and debits among `entries`, as rows of ledger_notes. */
export function ledgerNotes(entries: readonly LedgerEntry[]): { requestId: string; reason: string }[] {
  const notes: { requestId: string; reason: string }[] = []
  for (const e of entries) if (e.reason) notes.push({ requestId: e.requestId, reason: e.reason })
  return notes
}
