import { createReadStream, readFileSync } from 'node:fs'
import { createInterface } from 'node:readline'
import { parseArgs } from 'node:util'
import { nanoToRubNumber } from '../billing/money.ts'
import { type ReceiptKeySet, type ReceiptPayload, verifyReceipt } from '../billing/receipts.ts'

const HELP = `tropa receipts: check what an organization was billed, offline

Usage:
  tropa receipts verify <file> --keys <url or file>
      checks every line of a ledger export (GET /v1/activity?format=jsonl): its receipt's
      Ed25519 signature, with the server's public keys, and that the receipt says what the
      line says (request id, key, model, tokens, cost, time). Prints ok or FAILED per line, then
      a summary.

Flags:
  --keys <url|file>   the public keys: https://<tropa>/.well-known/tropa-receipts.json, or a
                      saved copy of it
  --allow-unsigned    lines without a receipt (billed while receipts were off) are not failures
  --quiet             print only the failed lines and the summary

Exit status: 0 every line verified, 1 a line failed (or had no receipt), 2 bad usage or keys.`

/** A line of the export, as far as its receipt speaks of it. */
interface ExportLine {
  request_id?: unknown
  key_id?: unknown
  model?: unknown
  prompt_tokens?: unknown
  cached_tokens?: unknown
  completion_tokens?: unknown
  cost_rub?: unknown
  ended_at_ms?: unknown
  receipt?: unknown
}

/** Where a verified receipt and its line disagree (empty: they agree). */
export function receiptMismatch(line: ExportLine, p: ReceiptPayload): string[] {
  let cost: number
  try {
    cost = nanoToRubNumber(BigInt(p.cost_nano))
  } catch {
    return ['cost_nano']
  }
  const want: [string, unknown, unknown][] = [
    ['request_id', line.request_id, p.request_id],
    ['key_id', line.key_id, p.key_id],
    ['model', line.model, p.model],
    ['prompt_tokens', line.prompt_tokens, p.prompt_tokens],
    ['cached_tokens', line.cached_tokens ?? 0, p.cached_tokens],
    ['completion_tokens', line.completion_tokens, p.completion_tokens],
    ['cost_rub', line.cost_rub, cost],
    ['ended_at_ms', line.ended_at_ms, p.ended_at_ms],
  ]
  return want.filter(([, a, b]) => a !== b).map(([name]) => name)
}

/** The key set at a URL or in a file. */
async function readKeys(where: string): Promise<ReceiptKeySet> {
  const text = /^https?:\/\//.test(where)
    ? await fetch(where).then(async (r) => {
        if (!r.ok) throw new Error(`${where} answered ${r.status}`)
        return r.text()
      })
    : readFileSync(where, 'utf8')
  const set = JSON.parse(text) as ReceiptKeySet
  if (!Array.isArray(set?.keys)) throw new Error(`${where} is not a key set (no "keys" list)`)
  return set
}

export async function runReceiptsCommand(argv: string[]): Promise<void> {
  let parsed: ReturnType<typeof parse>
  try {
    parsed = parse(argv)
  } catch (err) {
    console.error(`tropa receipts: ${(err as Error).message}\n\n${HELP}`)
    process.exit(2)
  }
  const { values, positionals } = parsed
  const [verb, file, ...extra] = positionals
  if (values.help || !verb) return void console.log(HELP)
  if (verb !== 'verify' || !file || extra.length > 0 || !values.keys) {
    console.error(`tropa receipts: expected: verify <file> --keys <url or file>\n\n${HELP}`)
    process.exit(2)
  }
  let keys: ReceiptKeySet
  try {
    keys = await readKeys(values.keys)
  } catch (err) {
    console.error(`tropa receipts: cannot read the keys: ${(err as Error).message}`)
    process.exit(2)
  }
  const counts = { ok: 0, failed: 0, unsigned: 0 }
  const lines = createInterface({ input: createReadStream(file), crlfDelay: Number.POSITIVE_INFINITY })
  let n = 0
  try {
    for await (const text of lines) {
      n++
      if (text.trim() === '') continue
      const verdict = await checkLine(text, keys)
      const unsigned = verdict.reason === 'no receipt'
      if (verdict.ok) counts.ok++
      else if (unsigned) counts.unsigned++
      else counts.failed++
      const failed = !verdict.ok && !(unsigned && values['allow-unsigned'])
      if (verdict.ok && !values.quiet) console.log(`line ${n}: ok ${verdict.id}`)
      else if (!verdict.ok && (failed || !values.quiet))
        console.log(`line ${n}: ${unsigned ? 'UNSIGNED' : 'FAILED'} ${verdict.id}: ${verdict.reason}`)
    }
  } catch (err) {
    console.error(`tropa receipts: cannot read ${file}: ${(err as Error).message}`)
    process.exit(2)
  }
  console.log(
    `${counts.ok + counts.failed + counts.unsigned} lines: ${counts.ok} ok, ${counts.failed} failed, ${counts.unsigned} without a receipt`,
  )
  if (counts.failed > 0 || (counts.unsigned > 0 && !values['allow-unsigned'])) process.exit(1)
}

async function checkLine(
  text: string,
  keys: ReceiptKeySet,
): Promise<{ ok: boolean; id: string; reason?: string }> {
  let line: ExportLine
  try {
    line = JSON.parse(text) as ExportLine
  } catch {
    return { ok: false, id: '-', reason: 'not JSON' }
  }
  if (!line || typeof line !== 'object') return { ok: false, id: '-', reason: 'not an object' }
  const id = typeof line.request_id === 'string' ? line.request_id : '-'
  if (line.receipt === undefined || line.receipt === null) return { ok: false, id, reason: 'no receipt' }
  if (typeof line.receipt !== 'string') return { ok: false, id, reason: 'the receipt is not text' }
  const check = await verifyReceipt(line.receipt, keys)
  if (!check.ok) return { ok: false, id, reason: check.reason }
  const wrong = receiptMismatch(line, check.payload)
  if (wrong.length > 0)
    return { ok: false, id, reason: `the line differs from its receipt in ${wrong.join(', ')}` }
  return { ok: true, id }
}

function parse(argv: string[]) {
  return parseArgs({
    args: argv,
    options: {
      keys: { type: 'string' },
      'allow-unsigned': { type: 'boolean' },
      quiet: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
    allowPositionals: true,
  })
}
