import { afterAll, expect, test } from 'bun:test'
import { openPostgresStore } from '../../src/storage/postgres/store.ts'
import { freshPgDatabase } from '../helpers/pg.ts'

const pg = await freshPgDatabase()
afterAll(() => pg.drop())

test('three nodes starting at once on a fresh database: one migrates, all open', async () => {
  // Separate processes would each run this; separate pools race the same way.
  const stores = await Promise.all([1, 2, 3].map(() => openPostgresStore({ url: pg.url, maxConnections: 3 })))
  try {
    await stores[0]!.insertOrg({ id: 'org_1', name: 'acme', balanceNano: 5n, createdAt: 1 })
    expect((await stores[2]!.getOrg('org_1'))?.name).toBe('acme')
  } finally {
    for (const s of stores) await s.close()
  }
})
