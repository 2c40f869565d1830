import { expect, test } from 'bun:test'
import { LiveOrg } from '../../src/identity/live.ts'

const org = (limits: Partial<ConstructorParameters<typeof LiveOrg>[0]>) =>
  new LiveOrg({ id: 'o', name: 'o', balanceNano: 0n, createdAt: 0, ...limits })

test('an organization without limits has no rates (the hot path checks only that field)', () => {
  expect(org({}).rates).toBeNull()
  expect(org({ rpmLimit: null, tpmLimit: null, modelLimits: {} }).rates).toBeNull()
  expect(org({ tpmLimit: 5 }).rates).not.toBeNull()
})

test('a model takes its exact entry, else the most specific matching pattern, else none', () => {
  const rates = org({
    modelLimits: {
      '*': { rpm: 1, tpm: null },
      'anthropic/*': { rpm: 2, tpm: null },
      'anthropic/claude-*': { rpm: 3, tpm: null },
      'anthropic/claude-haiku': { rpm: 4, tpm: 100 },
    },
  }).rates!
  expect(rates.forModel('anthropic/claude-haiku')).toEqual({
    entry: 'anthropic/claude-haiku',
    rpm: 4,
    tpm: 100,
  })
  expect(rates.forModel('anthropic/claude-opus')?.entry).toBe('anthropic/claude-*')
  expect(rates.forModel('anthropic/other')?.entry).toBe('anthropic/*')
  expect(rates.forModel('openai/gpt')?.entry).toBe('*')
  expect(org({ modelLimits: { 'a/*': { rpm: 1, tpm: null } } }).rates!.forModel('b/x')).toBeNull()
  // A dot in an entry is a dot, not any character.
  expect(org({ modelLimits: { 'a.b': { rpm: 1, tpm: null } } }).rates!.forModel('axb')).toBeNull()
})
