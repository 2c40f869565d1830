import { afterAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI from 'openai'
import { startSimFleet } from '../../src/simulator/index.ts'
import { freshPgDatabase } from '../helpers/pg.ts'
import { freePort, jsonCall, startRouterProcess } from '../helpers/process.ts'
import { ADMIN_TOKEN, defaultModels } from '../helpers/start.ts'
import { signatureValid, startReceiver, until } from '../helpers/webhook-receiver.ts'

// kill -9 while the receiver holds deliveries: the events are in the store's outbox, so the
// restarted router delivers every one; a delivery cut by the kill comes again with the same id.
const fleet = await startSimFleet([1, 2].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })))
afterAll(() => fleet.stop())

describe.each([['sqlite'], ['postgres']])('kill -9 during webhook delivery on %s', (store) => {
  test('every event delivered after a restart, signed; duplicates carry the same id and body', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tropa-webhooks-crash-'))
    const pg = store === 'postgres' ? await freshPgDatabase() : undefined
    const receiver = startReceiver()
    const configPath = join(dir, 'tropa.json')
    writeFileSync(
      configPath,
      JSON.stringify({
        server: { data_dir: dir, admin_token: ADMIN_TOKEN, log_level: 'error' },
        storage: { flush_interval_ms: 10, ...(pg && { kind: 'postgres', postgres_url: pg.url }) },
        // A lease is 2 x timeout_ms + 5 s: PostgreSQL's wait for the dead node's leases.
        webhooks: {
          poll_ms: 20,
          retry_base_ms: 50,
          retry_max_ms: 200,
          timeout_ms: 500,
          allow_private_urls: true,
        },
        models: defaultModels(fleet.nodes),
      }),
    )
    const port = freePort()
    let router = await startRouterProcess(configPath, port)
    try {
      const org = await jsonCall(router.url, '/v1/admin/organizations', ADMIN_TOKEN, {
        name: 'crash',
        balance_rub: 100,
      })
      const master = org.master_key as string
      const hook = await jsonCall(router.url, '/v1/webhooks', master, {
        url: receiver.url,
        events: ['key.limit_80', 'key.limit_100'],
      })
      const secret = hook.secret as string
      expect(secret).toMatch(/^whsec_/)
      // Every answer waits: the deliveries are in flight when the router is killed.
      receiver.hold()
      for (let k = 0; k < 3; k++) {
        const key = await jsonCall(router.url, '/v1/keys', master, { name: `k${k}`, limit_rub: 0.02 })
        const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: key.key as string, maxRetries: 0 })
        let refused = false
        for (let i = 0; i < 200 && !refused; i++)
          await client.chat.completions
            .create({
              model: 'test/chat',
              messages: [{ role: 'user', content: `k${k} ${i}` }],
              max_tokens: 40,
            })
            .catch((err) => {
              if (!(err instanceof OpenAI.APIError && err.status === 402)) throw err
              refused = true
            })
        expect(refused).toBe(true)
      }
      const listed = async () =>
        ((await jsonCall(router.url, `/v1/webhooks/${hook.id}/events`, master)).data ?? []) as {
          id: string
          status: string
        }[]
      // Six events in the outbox (80% and 100% of three keys), and deliveries held in flight.
      expect(await until(async () => (await listed()).length === 6 && receiver.deliveries.length > 0)).toBe(
        true,
      )
      const events = (await listed()).map((e) => e.id)
      expect(new Set(events).size).toBe(6)
      const heldIds = new Set(receiver.deliveries.map((d) => d.eventId))

      router.proc.kill('SIGKILL')
      await router.proc.exited
      receiver.release()
      // The held answers found their sender gone: the kill came before any answer was taken.
      expect(await until(() => receiver.deliveries.every((d) => d.answered !== 0))).toBe(true)
      expect(receiver.delivered().size).toBe(0)

      router = await startRouterProcess(configPath, port)
      expect(await until(() => events.every((id) => receiver.delivered().has(id)), 1000)).toBe(true)
      expect(new Set(receiver.deliveries.map((d) => d.eventId))).toEqual(new Set(events))
      for (const d of receiver.deliveries) {
        expect(signatureValid(secret, d.signature, d.body)).toBe(true)
        expect(d.payload.id).toBe(d.eventId)
        // A duplicate is the same event: the same id and the same body.
        expect(d.body).toBe(receiver.deliveries.find((x) => x.eventId === d.eventId)!.body)
      }
      // The deliveries the kill cut came again.
      for (const id of heldIds)
        expect(receiver.deliveries.filter((d) => d.eventId === id).length).toBeGreaterThanOrEqual(2)
      expect(await until(async () => (await listed()).every((e) => e.status === 'delivered'))).toBe(true)
    } finally {
      receiver.release()
      router.proc.kill('SIGKILL')
      await router.proc.exited
      receiver.stop()
      await pg?.drop()
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
