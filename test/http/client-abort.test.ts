import { afterAll, beforeAll, expect, test } from 'bun:test'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa
const logged: { level: string; msg: string }[] = []
beforeAll(async () => {
  t = await startTropa({
    nodes: [{ name: 'hanger', faults: { hang: true } }],
    models: ([hanger]) => [
      {
        id: 'test/chat',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: [{ name: 'hanger', base_url: hanger!.url }],
      },
    ],
    upstream: { first_byte_timeout_ms: 30_000 },
    log: (level, msg) => logged.push({ level, msg }),
  })
})
afterAll(() => t.stop())

test('a client that gives up on a non-streaming request: its money is released, and nothing is logged as an error', async () => {
  const org = async () =>
    (await (await t.admin(`/v1/admin/organizations/${t.orgId}`)).json()) as {
      balance_rub: number
      reserved_rub: number
    }
  const before = await org()
  const abort = new AbortController()
  const pending = t
    .fetch('/v1/chat/completions', {
      method: 'POST',
      signal: abort.signal,
      body: JSON.stringify({
        model: 'test/chat',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 50,
      }),
    })
    .catch((e: unknown) => e)
  // The request is admitted (its worst case held) and waits on a node that never answers.
  for (let i = 0; i < 200 && (await org()).reserved_rub === 0; i++) await Bun.sleep(10)
  expect((await org()).reserved_rub).toBeGreaterThan(0)
  abort.abort()
  expect(await pending).toBeInstanceOf(Error)
  for (let i = 0; i < 200 && (await org()).reserved_rub > 0; i++) await Bun.sleep(10)
  const after = await org()
  expect(after.reserved_rub).toBe(0)
  // Nothing came back from the node, so nothing is billed.
  expect(after.balance_rub).toBe(before.balance_rub)
  // Before, the abort's reason reached the error mapper as an "unhandled error" (a 500 no one read).
  expect(logged.filter((l) => l.level === 'error')).toEqual([])
})
