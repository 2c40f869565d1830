import type { Store } from '../../src/storage/store.ts'

/** An hour's start, and usage rows over two hours, three keys and two models. */
export const H0 = Date.UTC(2026, 10, 21, 10)

export async function seedUsage(store: Store, orgId: string): Promise<void> {
  await store.insertOrg({ id: orgId, name: orgId, balanceNano: 10n ** 12n, createdAt: 0 })
  await store.recordLedger(
    Array.from({ length: 24 }, (_, i) => ({
      requestId: `r${i}`,
      kind: 'usage' as const,
      orgId,
      keyId: `k${i % 3}`,
      model: i % 2 ? 'm/a' : 'm/b',
      node: null,
      promptTokens: 10 + i,
      completionTokens: i,
      costNano: 1_000n + BigInt(i),
      batchId: null,
      startedAtMs: H0 + i * 300_000,
      endedAtMs: H0 + i * 300_000,
      outcome: 'ok',
      estimated: false,
      cachedTokens: i % 4,
    })),
  )
}

/** Every grouping of the usage series over those hours, with and without a key or model filter. */
export function seriesOf(store: Store, orgId: string) {
  const q = { orgId, fromSec: H0 / 1000, toSec: H0 / 1000 + 7200 }
  return Promise.all(
    (['model', 'key', null] as const).flatMap((groupBy) => [
      store.usageHours({ ...q, groupBy }),
      store.usageHours({ ...q, groupBy, keyId: 'k1' }),
      store.usageHours({ ...q, groupBy, model: 'm/a' }),
    ]),
  )
}
