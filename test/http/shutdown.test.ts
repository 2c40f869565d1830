import { afterAll, expect, test } from 'bun:test'
import { type FuzzTarget, startFuzzTarget } from '../../bench/fuzz/target.ts'

// A graceful stop (SIGTERM) right after the last answers: every billed answer has its ledger row.
// The ledger thread was unref'd, so once the server and timers were gone the process exited in
// the middle of the last flush: 40% of the rows of a burst were lost.
let t: FuzzTarget | undefined
afterAll(() => t?.cleanup())

test('SIGTERM right after a burst of answers: every one of them is in the ledger', async () => {
  t = await startFuzzTarget()
  const target = t
  const answered = new Set<string>()
  await Promise.all(
    Array.from({ length: 8 }, async (_, w) => {
      for (let i = 0; i < 30; i++) {
        const res = await fetch(`${target.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${target.secrets.api}`, 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'test/chat',
            messages: [{ role: 'user', content: `hello ${w} ${i}` }],
            max_tokens: 5,
            stream: i % 2 === 0,
          }),
        })
        await res.text()
        expect(res.status).toBe(200)
        answered.add(res.headers.get('x-request-id')!)
      }
    }),
  )
  expect(await target.stop()).toBe('')
  const ledger = target.ledger()
  expect([...answered].filter((id) => !ledger.usage.has(id))).toEqual([])
  expect(ledger.usage.size).toBe(answered.size)
}, 60_000)
