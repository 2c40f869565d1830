/// <reference lib="webworker" />
// Entry point of the receipt thread (an entry of the compiled executable): signs receipts with
// Ed25519, off the event loop (an Ed25519 signature costs about 11 us of CPU). See ReceiptSigner.

import { createPrivateKey, type KeyObject, sign } from 'node:crypto'
import type { FromReceiptThread, ToReceiptThread } from './receipt-signer.ts'
import { receiptSigningInput } from './receipts.ts'

declare const self: Worker
const keys = new Map<string, KeyObject>()

self.onmessage = (ev: MessageEvent<ToReceiptThread>) => {
  const m = ev.data
  if (m.t === 'keys') {
    keys.clear()
    for (const k of m.keys)
      keys.set(k.kid, createPrivateKey({ key: Buffer.from(k.der), format: 'der', type: 'pkcs8' }))
    return
  }
  // Ten lines a receipt (ReceiptSigner.line); an unknown key or a bad line signs nothing ('').
  const f = m.text.split('\n')
  const out: string[] = []
  for (let i = 0; i + 9 < f.length; i += 10) {
    try {
      const key = keys.get(f[i]!)
      if (!key) {
        out.push('')
        continue
      }
      const input = receiptSigningInput(f[i]!, {
        requestId: f[i + 1]!,
        orgId: f[i + 2]!,
        keyId: f[i + 3]!,
        model: f[i + 4]!,
        promptTokens: Number(f[i + 5]),
        cachedTokens: Number(f[i + 6]),
        completionTokens: Number(f[i + 7]),
        costNano: BigInt(f[i + 8]!),
        endedAtMs: Number(f[i + 9]),
      })
      out.push(`${input}.${sign(null, Buffer.from(input), key).toString('base64url')}`)
    } catch {
      out.push('')
    }
  }
  self.postMessage({ t: 'signed', id: m.id, out: out.join('\n') } satisfies FromReceiptThread)
}
