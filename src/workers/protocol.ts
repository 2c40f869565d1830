import * as errors from '../errors.ts'
import type { BatchView } from './nodes.ts'

/**
 * The messages between the primary and its workers, over Bun's IPC channel (structured clone, so
 * bigints pass as they are). A worker asks (`c` is its call's number and the primary answers with
 * the same `c`) or tells (no `c`, no answer); the primary sends bus events (`ev`) that the worker
 * acknowledges with an `ack` telling.
 */
export type ToPrimary =
  | { readonly c?: number; readonly op: string; readonly a: readonly unknown[] }
  | { readonly ready: number }

export type ToWorker =
  | { readonly c: number; readonly ok: unknown }
  | { readonly c: number; readonly err: EncodedError }
  | { readonly ev: Record<string, unknown> & { readonly msg: string } }
  /** The primary asks the worker (its metrics); the worker answers with an `answer` telling. */
  | { readonly q: number; readonly ask: 'metrics' }
  /** What the primary's batches hold of the nodes (src/workers/nodes.ts). */
  | { readonly bv: BatchView }

/** The environment variable that makes a process one of the workers (its value: the worker's number). */
export const WORKER_ENV = 'TROPA_WORKER'
/** The port the workers listen on, chosen by the primary (a configured 0 is a real port by then). */
export const WORKER_PORT_ENV = 'TROPA_WORKER_PORT'

/** An error as it crosses the channel: its class's name and its own fields. */
export interface EncodedError {
  readonly name: string
  readonly fields: Record<string, unknown>
}

/** What the runtime puts on every error (where it was thrown): not the error's own. */
const RUNTIME_FIELDS = new Set(['stack', 'line', 'column', 'sourceURL', 'originalLine', 'originalColumn'])

export function encodeError(err: unknown): EncodedError {
  if (!(err instanceof Error)) return { name: 'Error', fields: { message: String(err) } }
  const fields: Record<string, unknown> = {}
  for (const k of Object.getOwnPropertyNames(err)) {
    if (RUNTIME_FIELDS.has(k)) continue
    const v = (err as unknown as Record<string, unknown>)[k]
    if (typeof v !== 'function') fields[k] = v
  }
  return { name: err.constructor.name, fields }
}

const CLASSES = new Map<string, object>(
  Object.values(errors)
    .filter((v): v is typeof errors.TropaError => typeof v === 'function' && v.prototype instanceof Error)
    .map((c) => [c.name, c.prototype]),
)

/** The same error on this side: a TropaError of the same class with the same fields (the HTTP answer is the same). */
export function decodeError(e: EncodedError): Error {
  const proto = CLASSES.get(e.name) ?? Error.prototype
  const err = Object.create(proto) as Error
  Object.assign(err, e.fields)
  Object.defineProperty(err, 'stack', { value: `${e.name}: ${String(e.fields.message)}`, configurable: true })
  return err
}

/**
 * Messages sent in one event-loop turn leave together, as one array: under load a worker's
 * reservations and settlements (and the primary's answers) cross the channel in batches, so the
 * per-message cost of the channel (a system call and a wake-up on each side) is paid once per turn.
 */
export class Outbox<M> {
  private queue: M[] = []
  private scheduled = false

  constructor(private readonly send: (batch: M[]) => void) {}

  push(m: M): void {
    this.queue.push(m)
    if (this.scheduled) return
    this.scheduled = true
    setImmediate(this.flush)
  }

  private readonly flush = () => {
    this.scheduled = false
    const batch = this.queue
    this.queue = []
    if (batch.length > 0) this.send(batch)
  }
}
