import { afterEach, beforeEach, describe, expect, test } from 'bun:test'
import type {
  ActivityQuery,
  BatchRecord,
  KeyRecord,
  LedgerEntry,
  Store,
  UsageHourSum,
} from '../../src/storage/store.ts'

/** A batch of org o1 and key k1, validating, with nothing counted yet; `extra` overrides. */
export const batchRecord = (id: string, extra: Partial<BatchRecord> = {}): BatchRecord => ({
  id,
  orgId: 'o1',
  keyId: 'k1',
  endpoint: '/v1/chat/completions',
  inputFileId: 'file-a',
  completionWindow: '24h',
  status: 'validating',
  outputFileId: null,
  errorFileId: null,
  errors: null,
  metadata: null,
  total: 0,
  completed: 0,
  failed: 0,
  costNano: 0n,
  createdAt: 1,
  expiresAt: 86_401,
  inProgressAt: null,
  finalizingAt: null,
  completedAt: null,
  failedAt: null,
  expiredAt: null,
  cancellingAt: null,
  cancelledAt: null,
  ...extra,
})

/** The behaviour every Store implementation must have; each driver's test file runs it. */
export function storeContract(name: string, open: () => Promise<Store>) {
  describe(`Store contract: ${name}`, () => {
    let store: Store
    beforeEach(async () => {
      store = await open()
    })
    afterEach(() => store.close())

    const org = (id: string, balanceNano = 0n) => ({
      id,
      name: `org ${id}`,
      balanceNano,
      createdAt: 1_700_000_000,
    })
    const key = (id: string, orgId: string, extra: Partial<KeyRecord> = {}): KeyRecord => ({
      id,
      orgId,
      kind: 'api',
      name: id,
      secretHash: `hash-${id}`,
      hint: 'sk-…abcd',
      limitNano: null,
      spentNano: 0n,
      status: 'active',
      createdAt: 1_700_000_000,
      lastUsedAt: null,
      revokedAt: null,
      expiresAt: null,
      models: null,
      rpmLimit: null,
      tpmLimit: null,
      maxConcurrency: null,
      budget: null,
      endUserBudget: null,
      ...extra,
    })
    const usage = (
      requestId: string,
      orgId: string,
      keyId: string,
      costNano: bigint,
      endedAtMs = 1_700_000_000_000,
    ): LedgerEntry => ({
      requestId,
      kind: 'usage',
      orgId,
      keyId,
      model: 'm/x',
      node: 'n1',
      promptTokens: 10,
      completionTokens: 5,
      costNano,
      batchId: null,
      startedAtMs: endedAtMs - 10,
      endedAtMs,
      outcome: 'ok',
      estimated: false,
    })

    test('meta: initMeta keeps the first value', async () => {
      expect(await store.getMeta('secret')).toBeUndefined()
      expect(await store.initMeta('secret', 'a')).toBe('a')
      expect(await store.initMeta('secret', 'b')).toBe('a')
    })

    test('orgs and keys round-trip, money beyond 2^53 included', async () => {
      const big = 9_007_199_254_740_993_000n
      await store.insertOrg(org('o1', big))
      expect((await store.getOrg('o1'))!.balanceNano).toBe(big)
      expect((await store.findOrgByName('org o1'))!.id).toBe('o1')
      await store.insertKey(key('k1', 'o1', { limitNano: big + 1n, rpmLimit: 60 }))
      const k = (await store.getKey('k1'))!
      expect(k.limitNano).toBe(big + 1n)
      expect(k.rpmLimit).toBe(60)
      expect(k.lastUsedAt).toBeNull()
      expect(k.expiresAt).toBeNull()
      expect(k.models).toBeNull()
      expect(await store.loadOrgs()).toHaveLength(1)
    })

    test("a key's expiry and models round-trip, and a patch changes and clears them", async () => {
      await store.insertOrg(org('o1'))
      await store.insertKey(
        key('k1', 'o1', { expiresAt: 1_900_000_000, models: ['anthropic/*', 'sim/chat-small'] }),
      )
      expect(await store.getKey('k1')).toMatchObject({
        expiresAt: 1_900_000_000,
        models: ['anthropic/*', 'sim/chat-small'],
      })
      await store.updateKey('k1', { models: [], expiresAt: null })
      expect(await store.getKey('k1')).toMatchObject({ expiresAt: null, models: [] })
      await store.updateKey('k1', { models: null })
      expect((await store.getKey('k1'))!.models).toBeNull()
      expect((await store.loadKeys()).find((x) => x.id === 'k1')!.models).toBeNull()
    })

    test("a key's max_concurrency and an organization's rate limits round-trip; patches change and clear them", async () => {
      await store.insertOrg(org('o1'))
      expect(await store.getOrg('o1')).toMatchObject({ rpmLimit: null, tpmLimit: null, modelLimits: null })
      await store.insertKey(key('k1', 'o1', { maxConcurrency: 3 }))
      expect((await store.getKey('k1'))!.maxConcurrency).toBe(3)
      await store.updateKey('k1', { maxConcurrency: null })
      expect((await store.getKey('k1'))!.maxConcurrency).toBeNull()

      const modelLimits = { 'anthropic/*': { rpm: 10, tpm: null }, 'sim/chat': { rpm: null, tpm: 5000 } }
      const after = await store.updateOrg('o1', { rpmLimit: 100, tpmLimit: 20_000, modelLimits })
      expect(after).toMatchObject({ id: 'o1', rpmLimit: 100, tpmLimit: 20_000, modelLimits })
      expect((await store.loadOrgs()).find((o) => o.id === 'o1')).toMatchObject({
        rpmLimit: 100,
        modelLimits,
      })
      // A patch leaves the fields it does not name, and the balance.
      await store.updateOrg('o1', { tpmLimit: null, modelLimits: null })
      expect(await store.getOrg('o1')).toMatchObject({
        rpmLimit: 100,
        tpmLimit: null,
        modelLimits: null,
        balanceNano: 0n,
      })
      expect(await store.updateOrg('o-missing', { rpmLimit: 1 })).toBeUndefined()
    })

    test('listKeys pages by id within one org and kind, and filters by status', async () => {
      await store.insertOrg(org('o1'))
      await store.insertOrg(org('o2'))
      for (const id of ['k3', 'k1', 'k2']) await store.insertKey(key(id, 'o1'))
      await store.insertKey(key('k4', 'o2'))
      await store.insertKey(key('m1', 'o1', { kind: 'master' }))
      await store.updateKey('k2', { status: 'revoked', revokedAt: 5 })
      const page = await store.listKeys({ orgId: 'o1', kind: 'api', limit: 2 })
      expect(page.map((k) => k.id)).toEqual(['k1', 'k2'])
      const next = await store.listKeys({ orgId: 'o1', kind: 'api', limit: 2, afterId: 'k2' })
      expect(next.map((k) => k.id)).toEqual(['k3'])
      const revoked = await store.listKeys({ orgId: 'o1', kind: 'api', limit: 10, status: 'revoked' })
      expect(revoked.map((k) => [k.id, k.revokedAt])).toEqual([['k2', 5]])
      expect(await store.loadKeys()).toHaveLength(5)
    })

    test('recordLedger moves spent, last use and balance with the rows, once per request id', async () => {
      await store.insertOrg(org('o1', 1_000_000n))
      await store.insertKey(key('k1', 'o1'))
      await store.recordLedger([
        usage('r1', 'o1', 'k1', 300n, 1_700_000_001_000),
        usage('r2', 'o1', 'k1', 200n, 1_700_000_002_500),
      ])
      // a replay (after a crash, say) must not bill twice
      await store.recordLedger([usage('r2', 'o1', 'k1', 200n), usage('r3', 'o1', 'k1', 1n)])
      expect((await store.getKey('k1'))!.spentNano).toBe(501n)
      expect((await store.getKey('k1'))!.lastUsedAt).toBe(1_700_000_002)
      expect((await store.getOrg('o1'))!.balanceNano).toBe(1_000_000n - 501n)
      const rows = await store.ledgerForOrg('o1', 0, 2_000_000_000_000)
      expect(rows.map((r) => r.requestId).sort()).toEqual(['r1', 'r2', 'r3'])
      expect(rows.reduce((s, r) => s + r.costNano, 0n)).toBe(501n)
    })

    test('a large flush with replays mixed in: every new row counted once, two keys and a credit', async () => {
      await store.insertOrg(org('o1', 1_000_000n))
      await store.insertKey(key('k1', 'o1'))
      await store.insertKey(key('k2', 'o1'))
      const row = (i: number) =>
        usage(`big-${i}`, 'o1', i % 3 === 0 ? 'k2' : 'k1', BigInt(i + 1), 1_700_000_000_000 + i * 1000)
      const first = Array.from({ length: 70 }, (_, i) => row(i))
      await store.recordLedger(first)
      // The second flush repeats 40 of them among 50 new ones and a credit, across statement chunks.
      const second = [
        ...Array.from({ length: 40 }, (_, i) => row(i * 1 + 20)),
        ...Array.from({ length: 50 }, (_, i) => row(70 + i)),
        { ...usage('big-credit', 'o1', 'k1', 1_000n), kind: 'credit' as const, keyId: null },
      ].sort((a, b) => a.requestId.localeCompare(b.requestId))
      await store.recordLedger(second)
      const cost = (from: number, to: number, k: 'k1' | 'k2') =>
        Array.from({ length: to - from }, (_, j) => from + j)
          .filter((i) => (i % 3 === 0 ? 'k2' : 'k1') === k)
          .reduce((s, i) => s + BigInt(i + 1), 0n)
      expect((await store.getKey('k1'))!.spentNano).toBe(cost(0, 120, 'k1'))
      expect((await store.getKey('k2'))!.spentNano).toBe(cost(0, 120, 'k2'))
      expect((await store.getKey('k2'))!.lastUsedAt).toBe(1_700_000_000 + 117)
      expect((await store.getOrg('o1'))!.balanceNano).toBe(
        1_000_000n + 1_000n - cost(0, 120, 'k1') - cost(0, 120, 'k2'),
      )
      expect(await store.ledgerForOrg('o1', 0, 2_000_000_000_000)).toHaveLength(121)
    })

    test('one request id twice in one flush is billed once (in a full chunk and in the tail)', async () => {
      await store.insertOrg(org('o1', 1_000_000n))
      await store.insertKey(key('k1', 'o1'))
      const rows = Array.from({ length: 20 }, (_, i) => usage(`dup-${i}`, 'o1', 'k1', 10n))
      // dup-3 again inside the first chunk of sixteen, dup-17 again in the tail, each with another
      // cost: the first row of an id is the one billed, in both stores.
      const again = (i: number) => ({ ...rows[i]!, costNano: 1_000n })
      await store.recordLedger([...rows.slice(0, 10), again(3), ...rows.slice(10), again(17)])
      expect((await store.getKey('k1'))!.spentNano).toBe(200n)
      expect((await store.getOrg('o1'))!.balanceNano).toBe(1_000_000n - 200n)
      const written = await store.ledgerForOrg('o1', 0, 2_000_000_000_000)
      expect(written).toHaveLength(20)
      expect(written.every((e) => e.costNano === 10n)).toBe(true)
    })

    test('budgets round-trip and clear; periodSpend sums by admission (end users apart, older rows by start); end users filter and group', async () => {
      await store.insertOrg(org('o1', 10n ** 15n))
      const budget = {
        amountNano: 9_007_199_254_740_993_000n,
        period: 'week' as const,
        timezone: 'Europe/Moscow',
      }
      await store.insertKey(key('k1', 'o1', { budget, endUserBudget: { ...budget, period: 'day' } }))
      expect((await store.getKey('k1'))!.budget).toEqual(budget)
      expect((await store.getKey('k1'))!.endUserBudget).toEqual({ ...budget, period: 'day' })
      await store.insertKey(key('k2', 'o1'))
      const from = 1_700_000_000_000
      const to = from + 86_400_000
      const row = (
        id: string,
        keyId: string,
        cost: bigint,
        admitted: number | null,
        endUser: string | null,
        startedAt = from + 5,
      ) => ({
        ...usage(id, 'o1', keyId, cost, startedAt + 10),
        startedAtMs: startedAt,
        admittedAtMs: admitted,
        endUser,
      })
      await store.recordLedger([
        row('a', 'k1', 100n, from, 'alice'),
        row('b', 'k1', 20n, to - 1, 'bob', to - 2),
        // Admitted before the period, settled in it: the period before's.
        row('c', 'k1', 4_000n, from - 1, 'alice', from - 3),
        // Admitted in the period, settled after it.
        row('d', 'k1', 3n, to - 5, 'alice', to - 6),
        row('e', 'k1', 50_000n, to, 'alice', to),
        // Before the key had a budget: counted by its start.
        row('f', 'k1', 7n, null, null, from + 100),
        row('g', 'k1', 70_000n, null, 'alice', from - 100),
        row('h', 'k2', 900n, from + 1, 'alice'),
      ])
      const q = { orgId: 'o1', keyId: 'k1', fromMs: from, toMs: to }
      expect(await store.periodSpend({ ...q, endUser: null })).toBe(100n + 20n + 3n + 7n)
      expect(await store.periodSpend({ ...q, endUser: 'alice' })).toBe(100n + 3n)
      expect(await store.periodSpend({ ...q, endUser: 'carol' })).toBe(0n)
      const rows = await store.listActivity({ orgId: 'o1', endUser: 'alice', limit: 100 })
      expect(rows.map((r) => r.requestId).sort()).toEqual(['a', 'c', 'd', 'e', 'g', 'h'])
      expect(rows.find((r) => r.requestId === 'a')).toMatchObject({ endUser: 'alice', admittedAtMs: from })
      const grouped = await store.usageByKeyModelDay('o1', 0, to * 2, { byEndUser: true })
      const k1 = grouped.filter((r) => r.keyId === 'k1')
      expect(k1.reduce((s, r) => s + r.costNano, 0n)).toBe(124_130n)
      expect(k1.filter((r) => r.endUser === 'alice').reduce((s, r) => s + r.requests, 0)).toBe(5)
      expect(k1.filter((r) => r.endUser === null).reduce((s, r) => s + r.requests, 0)).toBe(1)
      const bob = await store.usageByKeyModelDay('o1', 0, to * 2, { endUser: 'bob' })
      expect(bob.map((r) => [r.keyId, r.requests, r.costNano])).toEqual([['k1', 1, 20n]])
      await store.updateKey('k1', { budget: null, endUserBudget: null })
      expect((await store.getKey('k1'))!.budget).toBeNull()
      expect((await store.getKey('k1'))!.endUserBudget).toBeNull()
    })

    test('usage groups by key, model and UTC day, without credits', async () => {
      await store.insertOrg(org('o1', 10_000n))
      await store.insertKey(key('k1', 'o1'))
      await store.insertKey(key('k2', 'o1'))
      const day1 = Date.UTC(2026, 10, 21, 23, 59, 0)
      const day2 = Date.UTC(2026, 10, 22, 0, 1, 0)
      await store.recordLedger([
        usage('a', 'o1', 'k1', 100n, day1),
        usage('b', 'o1', 'k1', 50n, day1 + 1000),
        usage('c', 'o1', 'k1', 7n, day2),
        usage('d', 'o1', 'k2', 3n, day2),
        { ...usage('e', 'o1', 'k1', 9_999n, day2), kind: 'credit', keyId: null },
      ])
      const rows = await store.usageByKeyModelDay('o1', day1 - 1, day2 + 1)
      expect(rows).toEqual([
        {
          keyId: 'k1',
          model: 'm/x',
          day: '2026-11-21',
          requests: 2,
          promptTokens: 20,
          completionTokens: 10,
          costNano: 150n,
        },
        {
          keyId: 'k1',
          model: 'm/x',
          day: '2026-11-22',
          requests: 1,
          promptTokens: 10,
          completionTokens: 5,
          costNano: 7n,
        },
        {
          keyId: 'k2',
          model: 'm/x',
          day: '2026-11-22',
          requests: 1,
          promptTokens: 10,
          completionTokens: 5,
          costNano: 3n,
        },
      ])
      expect(await store.usageByKeyModelDay('o1', day2 + 10, day2 + 20)).toEqual([])
    })

    test('responses: put, get and delete within their organization only', async () => {
      const conversation = JSON.stringify([{ type: 'message', role: 'user', content: 'héllo ✓' }])
      const response = JSON.stringify({ id: 'resp_1', object: 'response', output: [] })
      await store.putResponse({ id: 'resp_1', orgId: 'o1', conversation, response, createdAt: 1_700_000_000 })
      await store.putResponse({ id: 'resp_2', orgId: 'o2', conversation: '[]', response: '{}', createdAt: 1 })
      expect(await store.getResponse('o1', 'resp_1')).toEqual({
        id: 'resp_1',
        orgId: 'o1',
        conversation,
        response,
        createdAt: 1_700_000_000,
      })
      expect(await store.getResponse('o2', 'resp_1')).toBeUndefined()
      expect(await store.getResponse('o1', 'resp_nope')).toBeUndefined()
      expect(await store.deleteResponse('o2', 'resp_1')).toBe(false)
      expect(await store.deleteResponse('o1', 'resp_1')).toBe(true)
      expect(await store.deleteResponse('o1', 'resp_1')).toBe(false)
      expect(await store.getResponse('o1', 'resp_1')).toBeUndefined()
      expect((await store.getResponse('o2', 'resp_2'))?.response).toBe('{}')
      // A conversation of megabytes round-trips whole.
      const big = JSON.stringify(['x'.repeat(3 * 1024 * 1024)])
      await store.putResponse({ id: 'resp_3', orgId: 'o1', conversation: big, response: '{}', createdAt: 2 })
      expect((await store.getResponse('o1', 'resp_3'))?.conversation).toBe(big)
      // Retention: everything created before the cut goes, whatever its organization.
      await store.putResponse({
        id: 'resp_4',
        orgId: 'o1',
        conversation: '[]',
        response: '{}',
        createdAt: 100,
      })
      expect(await store.deleteResponsesBefore(100, 1)).toBe(1) // at most `limit` at a time
      expect(await store.deleteResponsesBefore(100, 10)).toBe(1) // resp_2 (1) and resp_3 (2) gone
      expect(await store.getResponse('o2', 'resp_2')).toBeUndefined()
      expect(await store.getResponse('o1', 'resp_3')).toBeUndefined()
      expect((await store.getResponse('o1', 'resp_4'))?.createdAt).toBe(100)
      expect(await store.deleteResponsesBefore(100, 10)).toBe(0)
    })

    test('console sessions: insert, get, touch, delete, expire the idle ones', async () => {
      const s = (id: string, lastSeenAt: number, keyId: string | null = 'key_m') => ({
        id,
        kind: keyId === null ? ('admin' as const) : ('master' as const),
        keyId,
        csrf: `csrf-${id}`,
        createdAt: 1_700_000_000,
        lastSeenAt,
      })
      await store.insertConsoleSession(s('h1', 1_700_000_000))
      await store.insertConsoleSession(s('h2', 1_700_000_100, null))
      expect(await store.getConsoleSession('h1')).toEqual(s('h1', 1_700_000_000))
      expect(await store.getConsoleSession('h2')).toEqual(s('h2', 1_700_000_100, null))
      expect(await store.getConsoleSession('nope')).toBeUndefined()
      await store.touchConsoleSession('h1', 1_700_000_500)
      expect((await store.getConsoleSession('h1'))?.lastSeenAt).toBe(1_700_000_500)
      // A second session with the same id is refused: ids are hashes of random secrets.
      await expect(store.insertConsoleSession(s('h1', 1))).rejects.toThrow()
      expect(await store.deleteConsoleSession('h1')).toBe(true)
      expect(await store.deleteConsoleSession('h1')).toBe(false)
      expect(await store.getConsoleSession('h1')).toBeUndefined()
      await store.insertConsoleSession(s('h3', 10))
      await store.insertConsoleSession(s('h4', 20))
      expect(await store.deleteConsoleSessionsIdleBefore(1_000, 1)).toBe(1) // at most `limit`
      expect(await store.deleteConsoleSessionsIdleBefore(1_000, 10)).toBe(1)
      expect(await store.getConsoleSession('h3')).toBeUndefined()
      expect(await store.getConsoleSession('h4')).toBeUndefined()
      expect((await store.getConsoleSession('h2'))?.kind).toBe('admin')
      expect(await store.deleteConsoleSessionsIdleBefore(1_000, 10)).toBe(0)
    })

    test('files: insert, get, list newest first, soft delete', async () => {
      const f = (id: string, orgId = 'o1') => ({
        id,
        orgId,
        filename: `${id}.jsonl`,
        purpose: 'batch',
        bytes: 10,
        lines: 2,
        createdAt: 1,
        deletedAt: null,
      })
      for (const id of ['file-a', 'file-b', 'file-c']) await store.insertFile(f(id))
      await store.insertFile(f('file-z', 'o2'))
      expect((await store.getFile('file-b'))!.lines).toBe(2)
      expect((await store.listFiles('o1', undefined, 2)).map((x) => x.id)).toEqual(['file-c', 'file-b'])
      expect((await store.listFiles('o1', 'file-b', 10)).map((x) => x.id)).toEqual(['file-a'])
      await store.markFileDeleted('file-c', 5)
      expect((await store.listFiles('o1', undefined, 10)).map((x) => x.id)).toEqual(['file-b', 'file-a'])
      expect((await store.getFile('file-c'))!.deletedAt).toBe(5)
    })

    test('the batch queue: lease, retry, finish once, fail the rest, results in line order', async () => {
      await store.insertOrg(org('o1'))
      await store.insertBatch(batchRecord('batch_1', { metadata: '{"a":"b"}' }))
      await store.enqueueLines(
        [1, 2, 3, 4].map((line) => ({
          batchId: 'batch_1',
          line,
          customId: `c${line}`,
          body: '{}',
          attempts: 0,
        })),
      )
      // A second node validating the same file adds nothing and fails nothing.
      await store.enqueueLines([
        { batchId: 'batch_1', line: 1, customId: 'c1', body: '{"again":1}', attempts: 0 },
      ])
      expect(await store.openLineCount('batch_1')).toBe(4)
      expect(await store.leaseLines(60_000, 10)).toHaveLength(0) // not in progress yet
      expect(await store.updateBatch('batch_1', { status: 'in_progress', total: 4 }, ['completed'])).toBe(
        false,
      )
      expect(await store.updateBatch('batch_1', { status: 'in_progress', total: 4 }, ['validating'])).toBe(
        true,
      )
      const leased = await store.leaseLines(60_000, 3)
      expect(leased.map((l) => [l.line, l.attempts])).toEqual([
        [1, 1],
        [2, 1],
        [3, 1],
      ])
      await store.retryLine('batch_1', 3, 60_000) // back off for a minute
      expect((await store.leaseLines(60_000, 10)).map((l) => l.line)).toEqual([4]) // 3 waits for its back-off
      await store.retryLine('batch_1', 4, 0, true) // never reached an upstream: not an attempt
      expect((await store.leaseLines(60_000, 10)).map((l) => [l.line, l.attempts])).toEqual([[4, 1]])
      expect(await store.finishLine('batch_1', 2, true, '{"r":2}')).toBe(true)
      expect(await store.finishLine('batch_1', 2, true, '{"r":"again"}')).toBe(false) // written once
      expect(await store.finishLine('batch_1', 1, false, '{"e":1}')).toBe(true)
      expect(await store.openLineCount('batch_1')).toBe(2)
      expect(await store.releaseAllLeases()).toBe(1) // line 4
      expect(await store.failOpenLines('batch_1', (l) => `{"e":${l.line}}`, true)).toBe(2)
      expect(await store.openLineCount('batch_1')).toBe(0)
      expect(await store.lineResults('batch_1', true)).toEqual(['{"r":2}'])
      expect(await store.lineResults('batch_1', false)).toEqual(['{"e":1}', '{"e":3}', '{"e":4}'])
      const b = (await store.getBatch('batch_1'))!
      expect([b.status, b.total, b.completed, b.failed, b.metadata]).toEqual([
        'in_progress',
        4,
        1,
        3,
        '{"a":"b"}',
      ])
      await store.recordLedger([{ ...usage('batch_1-2', 'o1', 'k1', 500n), batchId: 'batch_1' }])
      expect(await store.batchCostNano('batch_1')).toBe(500n)
      expect((await store.batchesInStatus(['in_progress'])).map((x) => x.id)).toEqual(['batch_1'])
      // Finalization is claimed by one caller, stamped by the store's clock; another takes it over
      // only once the claim is stale by that same clock.
      const claim = (staleAfterSec: number) =>
        store.claimFinalize('batch_1', ['in_progress', 'finalizing'], { status: 'finalizing' }, staleAfterSec)
      expect(await store.claimFinalize('batch_1', ['cancelling'], {}, 30)).toBeUndefined()
      const before = Math.floor(Date.now() / 1000)
      const first = await claim(30)
      expect(first).toBeGreaterThanOrEqual(before - 1)
      expect(first).toBeLessThanOrEqual(Math.floor(Date.now() / 1000) + 1)
      expect((await store.getBatch('batch_1'))!.status).toBe('finalizing')
      expect(await claim(30)).toBeUndefined()
      // Stale (older than -1 s, which every claim is): taken over, with a stamp of its own.
      const second = await claim(-1)
      expect(second).toBeGreaterThanOrEqual(first!)
      expect((await store.getBatch('batch_1'))!.finalizingAt).toBe(second!)
      // Only the current claim can be given back; then the next claim succeeds at once.
      await store.releaseFinalize('batch_1', ['finalizing'], second! - 100)
      expect(await claim(30)).toBeUndefined()
      await store.releaseFinalize('batch_1', ['finalizing'], second!)
      expect((await store.getBatch('batch_1'))!.finalizingAt).toBeNull()
      expect(await claim(30)).toBeNumber()
      await store.updateBatch('batch_1', { status: 'in_progress', finalizingAt: null })
      expect((await store.listBatches('o1', undefined, 10)).map((x) => x.id)).toEqual(['batch_1'])
    })

    test("failing a large batch's open lines: every one once, the running ones when asked, the event loop running between chunks", async () => {
      await store.insertOrg(org('o1'))
      const id = 'batch_big'
      await store.insertBatch(batchRecord(id))
      const lines = 1_500
      await store.enqueueLines(
        Array.from({ length: lines }, (_, i) => ({
          batchId: id,
          line: i + 1,
          customId: `c${i + 1}`,
          body: '{}',
          attempts: 0,
        })),
      )
      await store.updateBatch(id, { status: 'in_progress', total: lines }, ['validating'])
      // Three lines run, one of them finishes; the other 1,497 wait.
      expect((await store.leaseLines(60_000, 3)).map((l) => l.line)).toEqual([1, 2, 3])
      expect(await store.finishLine(id, 1, true, '{"r":1}')).toBe(true)
      // Only the pending ones (a cancel): the running lines are left to finish. Meanwhile the
      // event loop runs (a timer set before the call fires before it resolves).
      let resolved = false
      let ranBefore = false
      setImmediate(() => {
        ranBefore = !resolved
      })
      const failed = await store.failOpenLines(
        id,
        (l) => `{"custom_id":"${l.customId}","line":${l.line}}`,
        true,
      )
      resolved = true
      expect(failed).toBe(lines - 3)
      expect(ranBefore).toBe(true)
      expect(await store.openLineCount(id)).toBe(2)
      // Then the rest, the running ones included; nothing is failed twice.
      expect(await store.failOpenLines(id, (l) => `{"custom_id":"${l.customId}","line":${l.line}}`)).toBe(2)
      expect(await store.failOpenLines(id, () => 'never')).toBe(0)
      expect(await store.finishLine(id, 2, true, '{"r":2}')).toBe(false)
      const b = (await store.getBatch(id))!
      expect([b.completed, b.failed]).toEqual([1, lines - 1])
      const results = await store.lineResults(id, false)
      expect(results).toHaveLength(lines - 1)
      // In line order, each line's own result.
      expect(results.map((r) => JSON.parse(r).line)).toEqual(
        Array.from({ length: lines - 1 }, (_, i) => i + 2),
      )
      expect(results.every((r) => JSON.parse(r).custom_id === `c${JSON.parse(r).line}`)).toBe(true)
    })

    test('cached tokens and TTFT round-trip, null when not reported', async () => {
      await store.insertOrg(org('o1', 1_000n))
      await store.insertKey(key('k1', 'o1'))
      await store.recordLedger([
        { ...usage('r1', 'o1', 'k1', 1n), cachedTokens: 64, ttftMs: 123 },
        { ...usage('r2', 'o1', 'k1', 1n), cachedTokens: 0, ttftMs: null },
        usage('r3', 'o1', 'k1', 1n),
      ])
      const byId = new Map((await store.ledgerForOrg('o1', 0, 2e12)).map((r) => [r.requestId, r]))
      expect([byId.get('r1')!.cachedTokens, byId.get('r1')!.ttftMs]).toEqual([64, 123])
      expect([byId.get('r2')!.cachedTokens, byId.get('r2')!.ttftMs]).toEqual([0, null])
      expect([byId.get('r3')!.cachedTokens, byId.get('r3')!.ttftMs]).toEqual([null, null])
      expect((await store.ledgerEntry('o1', 'r1'))!.cachedTokens).toBe(64)
    })

    test('listActivity: newest first, filters, credits only when asked, one organization', async () => {
      await store.insertOrg(org('o1', 10_000n))
      await store.insertOrg(org('o2', 10_000n))
      await store.insertKey(key('k1', 'o1'))
      await store.insertKey(key('k2', 'o1'))
      await store.insertKey(key('k3', 'o2'))
      const t = 1_700_000_000_000
      await store.recordLedger([
        usage('a', 'o1', 'k1', 1n, t),
        { ...usage('b', 'o1', 'k2', 2n, t + 10), model: 'm/y' },
        { ...usage('c', 'o1', 'k1', 3n, t + 20), outcome: 'client_disconnected' },
        usage('d', 'o2', 'k3', 4n, t + 30),
        { ...usage('e', 'o1', 'k1', 500n, t + 40), kind: 'credit', keyId: null, model: null },
      ])
      const ids = async (q: Partial<ActivityQuery>) =>
        (await store.listActivity({ orgId: 'o1', limit: 100, ...q })).map((r) => r.requestId)
      expect(await ids({})).toEqual(['c', 'b', 'a'])
      expect(await ids({ includeCredits: true })).toEqual(['e', 'c', 'b', 'a'])
      expect(await ids({ keyId: 'k1' })).toEqual(['c', 'a'])
      expect(await ids({ model: 'm/y' })).toEqual(['b'])
      expect(await ids({ outcome: 'client_disconnected' })).toEqual(['c'])
      expect(await ids({ outcome: 'ok' })).toEqual(['b', 'a'])
      expect(await ids({ fromMs: t + 10, toMs: t + 20 })).toEqual(['b'])
      expect(await ids({ limit: 2 })).toEqual(['c', 'b'])
      expect(await ids({ keyId: 'k3' })).toEqual([])
      expect(await store.ledgerEntry('o1', 'd')).toBeUndefined()
      expect((await store.ledgerEntry('o2', 'd'))!.costNano).toBe(4n)
    })

    test('listActivity pages by (ended time, request id): ties in one millisecond, no duplicates or gaps', async () => {
      await store.insertOrg(org('o1', 10n ** 12n))
      await store.insertKey(key('k1', 'o1'))
      const t = 1_700_000_000_000
      // 57 rows over 7 distinct milliseconds: pages of 5 cut through ties.
      const rows = Array.from({ length: 57 }, (_, i) =>
        usage(`r${String(i).padStart(3, '0')}`, 'o1', 'k1', 1n, t + (i % 7)),
      )
      await store.recordLedger(rows)
      const seen: string[] = []
      let before: ActivityQuery['before']
      for (;;) {
        const page = await store.listActivity({ orgId: 'o1', limit: 5, before })
        seen.push(...page.map((r) => r.requestId))
        if (page.length < 5) break
        const last = page.at(-1)!
        before = { endedAtMs: last.endedAtMs, requestId: last.requestId }
      }
      const expected = [...rows]
        .sort((a, b) => b.endedAtMs - a.endedAtMs || (a.requestId < b.requestId ? 1 : -1))
        .map((r) => r.requestId)
      expect(seen).toEqual(expected)
    })

    test('usageHours sums billed rows per UTC hour and key or model; replays, credits and other orgs excluded; batch lines count', async () => {
      await store.insertOrg(org('o1', 10n ** 12n))
      await store.insertOrg(org('o2', 10n ** 12n))
      await store.insertKey(key('k1', 'o1'))
      await store.insertKey(key('k2', 'o1'))
      const h0 = Date.UTC(2026, 10, 21, 10) // an hour's start
      const h0s = h0 / 1000
      await store.recordLedger([
        { ...usage('a', 'o1', 'k1', 100n, h0), cachedTokens: 4 },
        { ...usage('b', 'o1', 'k2', 50n, h0 + 3_599_999), model: 'm/y' },
        usage('c', 'o1', 'k1', 7n, h0 + 3_600_000),
        usage('d', 'o2', 'k1', 1_000n, h0),
        { ...usage('e', 'o1', 'k1', 9_999n, h0), kind: 'credit', keyId: null },
      ])
      await store.recordLedger([usage('a', 'o1', 'k1', 100n, h0)]) // a replay
      // A batch line's row, written with its result (PostgreSQL writes it apart from a flush).
      await store.enqueueLines([{ batchId: 'batch_h', line: 1, customId: 'x', body: '{}', attempts: 0 }])
      expect(
        await store.finishLine('batch_h', 1, true, '{}', {
          ...usage('batch_h-1', 'o1', 'k2', 11n, h0 + 60_000),
          batchId: 'batch_h',
          cachedTokens: 2,
        }),
      ).toBe(true)
      const q = { orgId: 'o1', fromSec: h0s, toSec: h0s + 7200 }
      const sum = (r: UsageHourSum) => [
        r.hourStart,
        r.group,
        r.requests,
        r.promptTokens,
        r.completionTokens,
        r.cachedTokens,
        r.costNano,
      ]
      expect((await store.usageHours({ ...q, groupBy: null })).map(sum)).toEqual([
        [h0s, null, 3, 30, 15, 6, 161n],
        [h0s + 3600, null, 1, 10, 5, 0, 7n],
      ])
      expect((await store.usageHours({ ...q, groupBy: 'key' })).map(sum)).toEqual([
        [h0s, 'k1', 1, 10, 5, 4, 100n],
        [h0s, 'k2', 2, 20, 10, 2, 61n],
        [h0s + 3600, 'k1', 1, 10, 5, 0, 7n],
      ])
      expect((await store.usageHours({ ...q, groupBy: 'model' })).map(sum)).toEqual([
        [h0s, 'm/x', 2, 20, 10, 6, 111n],
        [h0s, 'm/y', 1, 10, 5, 0, 50n],
        [h0s + 3600, 'm/x', 1, 10, 5, 0, 7n],
      ])
      expect(
        (await store.usageHours({ ...q, toSec: h0s + 3600, keyId: 'k2', groupBy: 'model' })).map(sum),
      ).toEqual([
        [h0s, 'm/x', 1, 10, 5, 2, 11n],
        [h0s, 'm/y', 1, 10, 5, 0, 50n],
      ])
      // Each filter across the other grouping, and a total of one key or one model.
      expect((await store.usageHours({ ...q, model: 'm/y', groupBy: 'key' })).map(sum)).toEqual([
        [h0s, 'k2', 1, 10, 5, 0, 50n],
      ])
      expect((await store.usageHours({ ...q, keyId: 'k1', groupBy: null })).map(sum)).toEqual([
        [h0s, null, 1, 10, 5, 4, 100n],
        [h0s + 3600, null, 1, 10, 5, 0, 7n],
      ])
      expect((await store.usageHours({ ...q, model: 'm/x', groupBy: null })).map(sum)).toEqual([
        [h0s, null, 2, 20, 10, 6, 111n],
        [h0s + 3600, null, 1, 10, 5, 0, 7n],
      ])
      expect((await store.usageHours({ ...q, keyId: 'k2', model: 'm/x', groupBy: 'key' })).map(sum)).toEqual([
        [h0s, 'k2', 1, 10, 5, 2, 11n],
      ])
      expect(await store.usageHours({ ...q, orgId: 'o3', groupBy: null })).toEqual([])
    })

    test('a credit adds to the balance and is a ledger row of its own', async () => {
      await store.insertOrg(org('o1'))
      await store.recordLedger([{ ...usage('c1', 'o1', 'k1', 5_000n), kind: 'credit', keyId: null }])
      expect((await store.getOrg('o1'))!.balanceNano).toBe(5_000n)
      expect((await store.ledgerForOrg('o1', 0, 2_000_000_000_000))[0]!.kind).toBe('credit')
    })
    test('webhooks: stored, listed, patched; the balance flag is a compare-and-set that writes its event once', async () => {
      const hook = {
        id: 'wh1',
        orgId: 'o1',
        url: 'https://example.com/h',
        secret: 'whsec_x',
        events: ['key.limit_80', 'balance.below_threshold'],
        balanceThresholdNano: 5_000n,
        enabled: true,
        balanceBelow: false,
        createdAt: 1_700_000_000,
      }
      await store.insertWebhook(hook)
      await store.insertWebhook({
        ...hook,
        id: 'wh2',
        orgId: 'o2',
        balanceThresholdNano: null,
        enabled: false,
      })
      expect(await store.getWebhook('wh1')).toEqual(hook)
      expect((await store.listWebhooks('o1')).map((w) => w.id)).toEqual(['wh1'])
      expect((await store.listWebhooks()).map((w) => w.id).sort()).toEqual(['wh1', 'wh2'])
      expect(
        await store.updateWebhook('wh1', { events: ['batch.failed'], balanceThresholdNano: null }),
      ).toEqual({
        ...hook,
        events: ['batch.failed'],
        balanceThresholdNano: null,
      })
      const ev = (eventId: string, webhookId = 'wh1', createdAtMs = 1_000) => ({
        webhookId,
        eventId,
        orgId: 'o1',
        type: 'balance.below_threshold',
        payload: `{"id":"${eventId}"}`,
        createdAtMs,
      })
      expect(await store.setWebhookBalanceBelow('wh1', true, ev('e1'))).toBe(true)
      expect(await store.setWebhookBalanceBelow('wh1', true, ev('e2'))).toBe(false)
      expect((await store.listWebhookEvents('wh1', 10)).map((e) => e.eventId)).toEqual(['e1'])
      expect((await store.getWebhook('wh1'))!.balanceBelow).toBe(true)
      expect(await store.setWebhookBalanceBelow('wh1', false)).toBe(true)
      expect(await store.setWebhookBalanceBelow('wh1', false)).toBe(false)
      expect(await store.deleteWebhook('wh2')).toBe(true)
      expect(await store.deleteWebhook('wh2')).toBe(false)
    })

    test('the webhook outbox: one row per (webhook, event id); claims lease due rows once; attempts are recorded', async () => {
      const hook = {
        id: 'wh1',
        orgId: 'o1',
        url: 'https://example.com/h',
        secret: 'whsec_x',
        events: ['key.limit_80'],
        balanceThresholdNano: null,
        enabled: true,
        balanceBelow: false,
        createdAt: 1_700_000_000,
      }
      await store.insertWebhook(hook)
      await store.insertWebhook({ ...hook, id: 'off', enabled: false })
      const ev = (eventId: string, webhookId = 'wh1', createdAtMs = 1_000) => ({
        webhookId,
        eventId,
        orgId: 'o1',
        type: 'key.limit_80',
        payload: `{"id":"${eventId}"}`,
        createdAtMs,
      })
      expect(await store.enqueueWebhookEvents([ev('a'), ev('b', 'wh1', 2_000), ev('a', 'off')])).toBe(3)
      expect(await store.enqueueWebhookEvents([ev('a'), ev('c', 'wh1', 9_000)])).toBe(1)
      // Due at 5 s: a and b (c is later; the disabled webhook's row waits).
      const claimed = await store.claimWebhookEvents(5_000, 1_000, 10)
      expect(claimed.map((j) => j.eventId).sort()).toEqual(['a', 'b'])
      expect(claimed[0]).toMatchObject({ url: hook.url, secret: 'whsec_x', attempts: 1, status: 'pending' })
      // Leased: not claimed again until the lease runs out.
      expect(await store.claimWebhookEvents(5_500, 1_000, 10)).toEqual([])
      await store.finishWebhookEvent('wh1', 'a', { status: 'delivered', atMs: 5_100, httpStatus: 204 })
      expect((await store.claimWebhookEvents(6_001, 1_000, 10)).map((j) => j.eventId)).toEqual(['b'])
      await store.finishWebhookEvent('wh1', 'b', {
        status: 'pending',
        nextAttemptAtMs: 20_000,
        error: 'HTTP 500',
        httpStatus: 500,
      })
      expect((await store.claimWebhookEvents(10_000, 1_000, 10)).map((j) => j.eventId)).toEqual(['c'])
      expect(await store.releaseWebhookLeases()).toBe(1)
      const rows = await store.listWebhookEvents('wh1', 10)
      expect(rows.map((r) => [r.eventId, r.status, r.attempts])).toEqual([
        ['c', 'pending', 1],
        ['b', 'pending', 2],
        ['a', 'delivered', 1],
      ])
      expect(rows[1]).toMatchObject({ lastError: 'HTTP 500', lastStatus: 500, nextAttemptAtMs: 20_000 })
      expect(rows[2]).toMatchObject({ deliveredAtMs: 5_100, lastStatus: 204 })
      await store.finishWebhookEvent('wh1', 'b', {
        status: 'failed',
        nextAttemptAtMs: 0,
        error: 'x',
        httpStatus: null,
      })
      expect(await store.pruneWebhookEvents(100_000, 10)).toBe(2)
      expect((await store.listWebhookEvents('wh1', 10)).map((r) => r.eventId)).toEqual(['c'])
      expect(await store.deleteWebhook('wh1')).toBe(true)
      expect(await store.listWebhookEvents('wh1', 10)).toEqual([])
    })

    test('receipt keys: oldest generation first, a generation taken once; ledger rows keep their receipt key', async () => {
      const k = (kid: string, generation: number) => ({
        kid,
        generation,
        publicKey: `pub-${kid}`,
        privateKey: `sealed-${kid}`,
        createdAt: 1_700_000_000 + generation,
      })
      expect(await store.receiptKeys()).toEqual([])
      expect(await store.addReceiptKey(k('rk_b', 2))).toBe(true)
      expect(await store.addReceiptKey(k('rk_a', 1))).toBe(true)
      // Two nodes rotating at once: the second key of the same generation is not added.
      expect(await store.addReceiptKey(k('rk_c', 2))).toBe(false)
      expect(await store.addReceiptKey(k('rk_a', 3))).toBe(false)
      expect(await store.receiptKeys()).toEqual([k('rk_a', 1), k('rk_b', 2)])

      await store.insertOrg(org('o1', 1_000_000n))
      await store.recordLedger([
        { ...usage('r-signed', 'o1', 'k1', 100n), receiptKid: 'rk_b' },
        usage('r-plain', 'o1', 'k1', 100n),
      ])
      const rows = await store.listActivity({ orgId: 'o1', limit: 10 })
      expect(Object.fromEntries(rows.map((r) => [r.requestId, r.receiptKid]))).toEqual({
        'r-signed': 'rk_b',
        'r-plain': null,
      })
    })
  })
}
