import { createHmac, timingSafeEqual } from 'node:crypto'

/** One POST the receiver got. */
export interface Delivery {
  readonly eventId: string
  readonly type: string
  readonly body: string
  readonly payload: {
    id: string
    type: string
    created: number
    organization: string
    data: Record<string, unknown>
  }
  readonly signature: string
  readonly attempt: number
  /** The status the receiver answered (0: not yet; -1: held, and the sender went away meanwhile). */
  answered: number
}

export interface ReceiverOptions {
  /** Answer 500 to the first `n` deliveries of each event id. */
  failFirst?: number
  /** Answer 500 always. */
  alwaysFail?: boolean
}

/**
 * A real webhook receiver on a free port (Bun.serve). It records every delivery, and can fail the
 * first attempts or hold answers until released (`hold()`), to test retries and a kill -9.
 */
export function startReceiver(o: ReceiverOptions = {}) {
  const deliveries: Delivery[] = []
  const seen = new Map<string, number>()
  let holding: Promise<void> | undefined
  let release: () => void = () => {}
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    async fetch(req) {
      const body = await req.text()
      const eventId = req.headers.get('tropa-event-id') ?? ''
      const d: Delivery = {
        eventId,
        type: req.headers.get('tropa-event-type') ?? '',
        body,
        payload: JSON.parse(body),
        signature: req.headers.get('tropa-signature') ?? '',
        attempt: Number(req.headers.get('tropa-delivery-attempt')),
        answered: 0,
      }
      deliveries.push(d)
      const n = (seen.get(eventId) ?? 0) + 1
      seen.set(eventId, n)
      if (holding) {
        await holding
        // The sender went away meanwhile (killed): it never had this answer.
        if (req.signal.aborted) {
          d.answered = -1
          return new Response('gone', { status: 503 })
        }
      }
      d.answered = o.alwaysFail || n <= (o.failFirst ?? 0) ? 500 : 200
      return new Response(d.answered === 200 ? 'ok' : 'try again', { status: d.answered })
    },
  })
  return {
    url: `http://127.0.0.1:${server.port}/hook`,
    deliveries,
    /** Deliveries answered 2xx, by event id (the first). */
    delivered(): Map<string, Delivery> {
      const m = new Map<string, Delivery>()
      for (const d of deliveries) if (d.answered === 200 && !m.has(d.eventId)) m.set(d.eventId, d)
      return m
    },
    /** From now on answers wait until `release()`. */
    hold() {
      holding = new Promise((r) => {
        release = r
      })
    },
    release() {
      holding = undefined
      release()
    },
    stop: () => server.stop(true),
  }
}
export type Receiver = ReturnType<typeof startReceiver>

/** Checks a tropa-signature header as a receiver would (Stripe's scheme), in constant time. */
export function signatureValid(secret: string, header: string, body: string): boolean {
  const parts = new Map(header.split(',').map((p) => p.split('=', 2) as [string, string]))
  const t = parts.get('t')
  const v1 = parts.get('v1')
  if (!t || !v1 || !/^\d+$/.test(t)) return false
  const expected = createHmac('sha256', secret).update(`${t}.${body}`).digest()
  const given = Buffer.from(v1, 'hex')
  return given.length === expected.length && timingSafeEqual(given, expected)
}

/** Polls until `cond` holds (every 20 ms, up to `tries`); returns whether it did. */
export async function until(cond: () => boolean | Promise<boolean>, tries = 500): Promise<boolean> {
  for (let i = 0; i < tries; i++) {
    if (await cond()) return true
    await Bun.sleep(20)
  }
  return false
}
