/**
 * `bun bench/receipt-sign.ts`: what one Ed25519 receipt costs, per thread. Signs a receipt's
 * bytes with node:crypto on this thread (a KeyObject made once), with WebCrypto (which Bun runs
 * in its thread pool), and through ReceiptSigner (the receipt thread, one message per turn) at 1
 * and 32 receipts in flight; prints the CPU each costs this thread (the event loop) and all the
 * others, from /proc. Numbers of a shared machine: read them as orders of magnitude.
 */
import { generateKeyPairSync, sign } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import { ReceiptSigner } from '../src/billing/receipt-signer.ts'
import { type ReceiptClaims, receiptSigningInput } from '../src/billing/receipts.ts'

const TICK_US = 10_000
/** CPU time (us) of this thread and of all the others. */
function cpu(): { loop: number; others: number } {
  let loop = 0
  let others = 0
  for (const t of readdirSync('/proc/self/task')) {
    const stat = readFileSync(`/proc/self/task/${t}/stat`, 'utf8')
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const us = (Number(f[11]) + Number(f[12])) * TICK_US
    if (Number(t) === process.pid) loop += us
    else others += us
  }
  return { loop, others }
}

const claims = (i: number): ReceiptClaims => ({
  requestId: `req${String(i).padStart(8, '0')}abcdefghijklm`,
  orgId: 'org_01m82bexrb9819k12bk7yk6ev6',
  keyId: 'key_01m82bexrmqxnrwg8g8mpmtc13',
  model: 'sim/chat-small',
  promptTokens: 16,
  cachedTokens: 0,
  completionTokens: 16,
  costNano: 1_440_000n,
  endedAtMs: Date.now(),
})

async function measure(name: string, n: number, f: (i: number) => unknown | Promise<unknown>, inFlight = 1) {
  const a = cpu()
  let left = n
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (left-- > 0) await f(left)
    }),
  )
  const b = cpu()
  console.log(
    `${name.padEnd(44)} event loop ${((b.loop - a.loop) / n).toFixed(2).padStart(6)} us, other threads ${((b.others - a.others) / n).toFixed(2).padStart(6)} us per receipt`,
  )
}

const N = 40_000
const { privateKey } = generateKeyPairSync('ed25519')
const input = Buffer.from(receiptSigningInput('rk_1', claims(1)))
await measure('node:crypto sign, on this thread', N, () => sign(null, input, privateKey))
const web = (await crypto.subtle.generateKey({ name: 'Ed25519' }, false, ['sign', 'verify'])) as CryptoKeyPair
await measure('WebCrypto sign, 32 at once', N, () => crypto.subtle.sign('Ed25519', web.privateKey, input), 32)
const signer = new ReceiptSigner(new URL('../src/billing/receipt-thread.ts', import.meta.url), (e) => {
  throw e
})
signer.useKeys([{ kid: 'rk_1', der: new Uint8Array(privateKey.export({ format: 'der', type: 'pkcs8' })) }])
await signer.sign('rk_1', claims(0))
for (const inFlight of [1, 32])
  await measure(
    `receipt thread (ReceiptSigner), ${inFlight} in flight`,
    N / (inFlight === 1 ? 4 : 1),
    async (i) => {
      if (!(await signer.sign('rk_1', claims(i)))) throw new Error('no receipt')
    },
    inFlight,
  )
signer.close()
