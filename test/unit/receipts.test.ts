import { expect, test } from 'bun:test'
import { generateKeyPairSync } from 'node:crypto'
import { newReceiptKey, openKey, sealKey } from '../../src/billing/receipt-keys.ts'
import { ReceiptSigner } from '../../src/billing/receipt-signer.ts'
import { type ReceiptClaims, type ReceiptKeySet, verifyReceipt } from '../../src/billing/receipts.ts'

const claims = (i: number): ReceiptClaims => ({
  requestId: `req${i}`,
  orgId: 'org_1',
  keyId: 'key_1',
  model: 'test/chat',
  promptTokens: 10 + i,
  cachedTokens: 0,
  completionTokens: 20 + i,
  costNano: BigInt(1000 * i),
  endedAtMs: 1_795_000_000_000 + i,
})

test('the receipt thread and the event loop sign the same bytes; every receipt verifies', async () => {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519')
  const x = (publicKey.export({ format: 'jwk' }) as { x: string }).x
  const set: ReceiptKeySet = {
    keys: [{ kty: 'OKP', crv: 'Ed25519', x, kid: 'rk_t', alg: 'EdDSA', use: 'sig', created_at: 0 }],
    current_kid: 'rk_t',
  }
  const errors: Error[] = []
  const signer = new ReceiptSigner(new URL('../../src/billing/receipt-thread.ts', import.meta.url), (e) =>
    errors.push(e),
  )
  signer.useKeys([{ kid: 'rk_t', der: new Uint8Array(privateKey.export({ format: 'der', type: 'pkcs8' })) }])
  try {
    // Ten in one turn go to the thread; one alone is signed on the event loop.
    const many = await Promise.all(Array.from({ length: 10 }, (_, i) => signer.sign('rk_t', claims(i))))
    const alone = await signer.sign('rk_t', claims(3))
    expect(alone).toBe(many[3]!)
    // An export's page (always the thread), in order.
    const page = await signer.signMany([5, 1].map((i) => ({ kid: 'rk_t', claims: claims(i) })))
    expect(page).toEqual([many[5]!, many[1]!])
    for (let i = 0; i < 10; i++) {
      const r = await verifyReceipt(many[i]!, set)
      expect(r.ok).toBe(true)
      if (r.ok) expect(r.payload).toMatchObject({ request_id: `req${i}`, cost_nano: String(1000 * i) })
    }
    // A key it does not hold signs nothing, on either side.
    expect(await signer.sign('rk_other', claims(0))).toBeUndefined()
    expect(await Promise.all([1, 2, 3].map((i) => signer.sign('rk_other', claims(i))))).toEqual([
      undefined,
      undefined,
      undefined,
    ])
    expect(errors).toEqual([])
  } finally {
    signer.close()
  }
})

test('a sealed key opens only with its secret and its kid', () => {
  const k = newReceiptKey(1, 'a-secret-of-at-least-32-characters!!', 0)
  const der = openKey(k.privateKey, k.kid, 'a-secret-of-at-least-32-characters!!')
  expect(der.length).toBeGreaterThan(32)
  expect(() => openKey(k.privateKey, k.kid, 'another-secret-of-32-characters-or-more')).toThrow()
  expect(() => openKey(k.privateKey, 'rk_other', 'a-secret-of-at-least-32-characters!!')).toThrow()
  const again = sealKey(der, k.kid, 's')
  expect(again).not.toBe(k.privateKey)
  expect(openKey(again, k.kid, 's').equals(der)).toBe(true)
})
