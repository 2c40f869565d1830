import { parseArgs } from 'node:util'

const HELP = `tropa batches: follow batches from the command line

Usage:
  tropa batches watch <batch_id>   a progress bar until the batch ends
  tropa batches list               the latest batches

Flags:
  --base-url <url>   Tropa's address (default $TROPA_BASE_URL or http://127.0.0.1:8080)
  --api-key <key>    an API key of the batch's organization (default $TROPA_API_KEY)
  --interval <ms>    how often to poll (default 500)`

interface BatchView {
  id: string
  status: string
  created_at: number
  request_counts: { total: number; completed: number; failed: number }
  cost_rub: number
  output_file_id: string | null
  error_file_id: string | null
}

const FINAL = new Set(['completed', 'failed', 'expired', 'cancelled'])

/** `tropa batches ...`: a thin client of the Batch API. */
export async function runBatchesCommand(argv: string[]): Promise<void> {
  const { values, positionals } = parseArgs({
    args: argv,
    options: {
      'base-url': { type: 'string' },
      'api-key': { type: 'string' },
      interval: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    allowPositionals: true,
    strict: true,
  })
  const [verb, id] = positionals
  if (values.help || !verb) return void console.log(HELP)
  const base = (values['base-url'] ?? process.env.TROPA_BASE_URL ?? 'http://127.0.0.1:8080').replace(
    /\/+$/,
    '',
  )
  const key = values['api-key'] ?? process.env.TROPA_API_KEY
  if (!key) throw new Error('an API key is needed: --api-key or TROPA_API_KEY')
  const get = async <T>(path: string): Promise<T> => {
    const res = await fetch(`${base}/v1${path}`, { headers: { authorization: `Bearer ${key}` } })
    const body = (await res.json()) as T & { error?: { message: string } }
    if (!res.ok) throw new Error(body.error?.message ?? `HTTP ${res.status}`)
    return body
  }
  if (verb === 'list') {
    const list = await get<{ data: BatchView[] }>('/batches?limit=20')
    for (const b of list.data)
      console.log(
        `${b.id}  ${b.status.padEnd(11)} ${b.request_counts.completed + b.request_counts.failed}/${b.request_counts.total}  ${b.cost_rub} RUB`,
      )
    return
  }
  if (verb !== 'watch' || !id) return void console.log(HELP)
  const interval = Number(values.interval ?? 500)
  const tty = process.stdout.isTTY === true
  const started = Date.now()
  let firstDone: number | undefined
  for (;;) {
    const b = await get<BatchView>(`/batches/${encodeURIComponent(id)}`)
    const done = b.request_counts.completed + b.request_counts.failed
    firstDone ??= done
    const elapsed = (Date.now() - started) / 1000
    const rate = elapsed > 0 ? (done - firstDone) / elapsed : 0
    const line = progressLine(b, rate)
    if (tty) process.stdout.write(`\r${line}\x1b[K`)
    else console.log(line)
    if (FINAL.has(b.status)) {
      if (tty) process.stdout.write('\n')
      if (b.output_file_id) console.log(`output: ${b.output_file_id}`)
      if (b.error_file_id) console.log(`errors: ${b.error_file_id}`)
      return
    }
    await Bun.sleep(interval)
  }
}

/** `[#####.....]  50% 100/200 done, 2 failed, 12.3 lines/s, 0.42 RUB, in_progress`. */
export function progressLine(b: BatchView, linesPerSec: number, width = 30): string {
  const { total, completed, failed } = b.request_counts
  const done = completed + failed
  const share = total > 0 ? done / total : 0
  const filled = Math.round(share * width)
  const bar = `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`
  return `${bar} ${String(Math.round(share * 100)).padStart(3)}% ${done}/${total} done, ${failed} failed, ${linesPerSec.toFixed(1)} lines/s, ${b.cost_rub} RUB, ${b.status}`
}
