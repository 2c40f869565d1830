import { expect } from 'bun:test'
import type { Tropa } from './start.ts'

/** The organization's usage rows in the ledger, once what is queued is written. */
export async function usageRows(t: Tropa) {
  await t.svc.ledger.flush()
  return (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter((r) => r.kind === 'usage')
}

/**
 * A streamed chat (or, with path /v1/completions, a legacy completion) whose client leaves after
 * three text events: one ledger row, outcome client_disconnected, billed for some but not all of
 * `maxTokens`; nothing in flight and the node's engine no longer generating. Returns the row for
 * further checks.
 */
export async function leaveMidStream(
  t: Tropa,
  body: Record<string, unknown>,
  maxTokens: number,
  path: '/v1/chat/completions' | '/v1/completions' = '/v1/chat/completions',
) {
  const marker = path === '/v1/completions' ? '"text":"' : '"content":"'
  const controller = new AbortController()
  const res = await t.fetch(path, {
    method: 'POST',
    body: JSON.stringify({ ...body, stream: true, max_tokens: maxTokens }),
    signal: controller.signal,
  })
  const reader = res.body!.getReader()
  let received = ''
  while (received.split(marker).length < 4) {
    const { value } = await reader.read()
    received += new TextDecoder().decode(value)
  }
  controller.abort()
  await Bun.sleep(300)
  const rows = await usageRows(t)
  expect(rows).toHaveLength(1)
  expect(rows[0]!.outcome).toBe('client_disconnected')
  expect(rows[0]!.completionTokens).toBeGreaterThan(0)
  expect(rows[0]!.completionTokens).toBeLessThan(maxTokens)
  expect([...t.svc.deps.pool.nodes.values()][0]!.inFlight).toBe(0)
  // The node stopped generating (it would run on to max_tokens otherwise).
  expect(t.nodes[0]!.stats().running).toBe(0)
  return rows[0]!
}
