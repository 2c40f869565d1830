import { createPrivateKey, type KeyObject, sign } from 'node:crypto'
import { type ReceiptClaims, receiptSigningInput } from './receipts.ts'

/** Messages to the receipt thread. */
export type ToReceiptThread =
  | { t: 'keys'; keys: { kid: string; der: Uint8Array }[] }
  /** Receipts to sign: ten lines each (ReceiptSigner.line), end to end. */
  | { t: 'sign'; id: number; text: string }

/** Its answer: one receipt per line ('' when it could not sign), in order. */
export type FromReceiptThread = { t: 'signed'; id: number; out: string }

/** A turn with this many receipts or fewer signs them on the event loop (see ReceiptSigner). */
const INLINE_MAX = 1

interface Batch {
  readonly resolve: ((receipt: string | undefined) => void)[]
}

/**
 * Signs receipts in a thread of its own. An Ed25519 signature takes about 11 us of CPU (Bun's
 * node:crypto; WebCrypto's costs the event loop 5 us of its own): a third of what a pass-through
 * request costs the loop. The loop only keeps the claims and, once per turn, posts the turn's
 * receipts in one message (about 1.5 us a receipt at 32 in flight). A message costs the loop
 * about 20 us, waking up for the answer included, so a turn with at most INLINE_MAX receipts
 * signs them here instead (11 us each, and no wait). A request waits for its receipt one round
 * trip to the thread. Never rejects: a receipt that could not be signed (the thread died) is
 * undefined, and the answer goes out without it.
 */
export class ReceiptSigner {
  private worker: Worker | undefined
  private items: { kid: string; claims: ReceiptClaims }[] = []
  private waiting: ((receipt: string | undefined) => void)[] = []
  /** The same keys as the thread's, for the turns signed here. */
  private readonly here = new Map<string, KeyObject>()
  private queued = false
  private nextId = 0
  private readonly pending = new Map<number, Batch>()
  private keys: { kid: string; der: Uint8Array }[] = []

  constructor(
    /** The thread's entry point (main.ts knows where it is inside the executable). */
    private readonly entry: string | URL,
    private readonly onError: (err: Error) => void,
  ) {}

  /** The private keys the thread signs with (every key this node can open), by kid. */
  useKeys(keys: { kid: string; der: Uint8Array }[]): void {
    this.keys = keys
    this.here.clear()
    for (const k of keys)
      this.here.set(k.kid, createPrivateKey({ key: Buffer.from(k.der), format: 'der', type: 'pkcs8' }))
    this.worker?.postMessage({ t: 'keys', keys } satisfies ToReceiptThread)
  }

  /** The receipt of `claims` signed with key `kid`, with the other receipts of this turn. */
  sign(kid: string, c: ReceiptClaims): Promise<string | undefined> {
    this.items.push({ kid, claims: c })
    if (!this.queued) {
      this.queued = true
      setImmediate(this.post)
    }
    return new Promise((resolve) => this.waiting.push(resolve))
  }

  /** Many receipts in one message (an export's page). */
  signMany(items: readonly { kid: string; claims: ReceiptClaims }[]): Promise<(string | undefined)[]> {
    if (items.length === 0) return Promise.resolve([])
    let text = ''
    for (const it of items) text += ReceiptSigner.line(it.kid, it.claims)
    const out: (string | undefined)[] = new Array(items.length)
    let left = items.length
    return new Promise((resolve) => {
      const each = items.map((_, i) => (r: string | undefined) => {
        out[i] = r
        if (--left === 0) resolve(out)
      })
      this.send(text, each)
    })
  }

  /** A receipt's ten lines: no field can hold a newline (ids are Tropa's, model ids are checked at load). */
  private static line(kid: string, c: ReceiptClaims): string {
    return `${kid}\n${c.requestId}\n${c.orgId}\n${c.keyId}\n${c.model}\n${c.promptTokens}\n${c.cachedTokens}\n${c.completionTokens}\n${c.costNano}\n${c.endedAtMs}\n`
  }

  private readonly post = () => {
    this.queued = false
    const items = this.items
    const waiting = this.waiting
    this.items = []
    this.waiting = []
    if (items.length <= INLINE_MAX) {
      for (let i = 0; i < items.length; i++) waiting[i]!(this.signHere(items[i]!.kid, items[i]!.claims))
      return
    }
    let text = ''
    for (const it of items) text += ReceiptSigner.line(it.kid, it.claims)
    this.send(text, waiting)
  }

  private signHere(kid: string, c: ReceiptClaims): string | undefined {
    const key = this.here.get(kid)
    if (!key) return undefined
    try {
      const input = receiptSigningInput(kid, c)
      return `${input}.${sign(null, Buffer.from(input), key).toString('base64url')}`
    } catch (err) {
      this.onError(err as Error)
      return undefined
    }
  }

  private send(text: string, resolve: ((receipt: string | undefined) => void)[]): void {
    let w: Worker
    try {
      w = this.start()
    } catch (err) {
      this.onError(err as Error)
      for (const r of resolve) r(undefined)
      return
    }
    const id = ++this.nextId
    if (this.pending.size === 0) w.ref()
    this.pending.set(id, { resolve })
    w.postMessage({ t: 'sign', id, text } satisfies ToReceiptThread)
  }

  private start(): Worker {
    if (this.worker) return this.worker
    const w = new Worker(this.entry)
    w.onmessage = (ev: MessageEvent<FromReceiptThread>) => {
      const batch = this.pending.get(ev.data.id)
      if (!batch) return
      this.pending.delete(ev.data.id)
      if (this.pending.size === 0) w.unref()
      const out = ev.data.out.split('\n')
      for (let i = 0; i < batch.resolve.length; i++) batch.resolve[i]!(out[i] || undefined)
    }
    // A dead thread answers what it held with no receipt, and is replaced by the next call.
    w.onerror = (ev) => this.fail(w, new Error(`receipt thread failed: ${ev.message}`))
    w.addEventListener('close', () => this.fail(w, new Error('receipt thread exited')))
    w.postMessage({ t: 'keys', keys: this.keys } satisfies ToReceiptThread)
    w.unref()
    this.worker = w
    return w
  }

  private fail(w: Worker, err: Error): void {
    if (this.worker !== w) return
    this.worker = undefined
    if (this.pending.size > 0) this.onError(err)
    for (const b of this.pending.values()) for (const r of b.resolve) r(undefined)
    this.pending.clear()
  }

  close(): void {
    const w = this.worker
    this.worker = undefined
    for (const b of this.pending.values()) for (const r of b.resolve) r(undefined)
    this.pending.clear()
    w?.terminate()
  }
}
