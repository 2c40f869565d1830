import { RedisClient } from 'bun'

/** The name under which the calls of one turn run together (see `inTurn`). */
const TURN = '\0turn'
/** How a call of a turn that raised an error comes back in the turn's reply. */
const FAILED = 'ERR@turn: '
/** At most this many calls in one turn's script call; more go in further calls, in order. */
const TURN_SLICE = 128

/**
 * A Redis connection that runs named Lua scripts: by their text (EVAL) until Redis has run them
 * on this connection, then by their SHA (computed here). Every call goes out the moment it is
 * made, so Redis runs them in the order made (a first use that waited for a `SCRIPT LOAD` was
 * overtaken by a later call of a script already known). After a reconnection the texts are sent
 * again; if Redis forgot a script without a reconnection (`SCRIPT FLUSH`), the call that finds out
 * is sent again with the text. Once connected, a lost connection fails a call at once (the client
 * reconnects in the background), so a request is refused rather than left waiting.
 *
 * `inTurn` runs a script with the others called in the same turn of the event loop, all in one
 * script call at its end, each exactly as alone and in the order called: a round trip costs the
 * loop about 15 us of CPU, more than a request's whole money path, and every request makes one
 * or two (reserve and settle; rate limits; concurrency).
 */
export class RedisScripts<Name extends string> {
  readonly redis: RedisClient
  private readonly texts: Record<string, string>
  private readonly sha: Record<string, string>
  /** Scripts Redis has run on this connection (so it holds them). */
  private readonly loaded = new Set<string>()
  private connectedOnce = false
  private turn: { name: Name; keys: readonly string[]; args: readonly string[]; done: Settle }[] = []

  constructor(url: string, scripts: Readonly<Record<Name, string>>) {
    this.redis = new RedisClient(url, {
      autoReconnect: true,
      maxRetries: 1_000_000,
      enableOfflineQueue: false,
      connectionTimeout: 2000,
    })
    this.texts = { ...scripts, [TURN]: turnScript(scripts) }
    this.sha = Object.fromEntries(
      Object.entries(this.texts).map(([name, text]) => [
        name,
        new Bun.CryptoHasher('sha1').update(text).digest('hex'),
      ]),
    )
    this.redis.onclose = () => this.loaded.clear()
  }

  /** Asks for a reconnection if the connection was lost (called from a periodic tick). */
  poke(): void {
    if (this.connectedOnce && !this.redis.connected) void this.redis.connect().catch(() => {})
  }

  async run(name: Name, keys: readonly string[], args: readonly string[]): Promise<string> {
    return String(await this.reply(name, keys, args))
  }

  /** The script's reply as Redis gave it (arrays stay arrays). */
  reply(name: Name, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    return this.send(name, keys, args)
  }

  /** As `reply`, sent at the end of this turn of the event loop with the turn's other calls. */
  inTurn(name: Name, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    return new Promise((resolve, reject) => {
      if (this.turn.length === 0) setImmediate(this.sendTurn)
      this.turn.push({ name, keys, args, done: { resolve, reject } })
    })
  }

  /** Sends the calls of the turn now (before the connection closes, say). */
  readonly sendTurn = () => {
    const calls = this.turn
    this.turn = []
    for (let i = 0; i < calls.length; i += TURN_SLICE) {
      const slice = calls.slice(i, i + TURN_SLICE)
      const only = slice.length === 1 ? slice[0]! : undefined
      if (only) {
        this.send(only.name, only.keys, only.args).then(only.done.resolve, only.done.reject)
        continue
      }
      const keys: string[] = []
      const args: string[] = [String(slice.length)]
      for (const c of slice) {
        keys.push(...c.keys)
        args.push(c.name, String(c.keys.length), String(c.args.length), ...c.args)
      }
      this.send(TURN, keys, args).then(
        (replies) => {
          slice.forEach((c, j) => {
            const r = (replies as unknown[])[j]
            if (typeof r === 'string' && r.startsWith(FAILED))
              c.done.reject(new Error(r.slice(FAILED.length)))
            else c.done.resolve(r)
          })
        },
        (err) => {
          for (const c of slice) c.done.reject(err)
        },
      )
    }
  }

  private async send(name: string, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    if (!this.redis.connected) {
      if (this.connectedOnce) throw new Error('Redis is not connected')
      await this.redis.connect()
      this.connectedOnce = true
    }
    if (!this.loaded.has(name)) {
      // EVAL runs the text and keeps it, so the next EVALSHA finds it.
      const out = await this.redis.send('EVAL', [this.texts[name]!, String(keys.length), ...keys, ...args])
      this.loaded.add(name)
      return out
    }
    try {
      return await this.redis.send('EVALSHA', [this.sha[name]!, String(keys.length), ...keys, ...args])
    } catch (err) {
      if (!String((err as Error).message).includes('NOSCRIPT')) throw err
      return await this.redis.send('EVAL', [this.texts[name]!, String(keys.length), ...keys, ...args])
    }
  }
}

interface Settle {
  resolve: (v: unknown) => void
  reject: (err: unknown) => void
}

/**
 * One script holding every script as a function of its own KEYS and ARGV, and running a turn's
 * calls in order. ARGV: the number of calls, then for each its name, its number of keys and of
 * arguments, and its arguments; KEYS: every call's keys, in order. A call that raises an error
 * comes back as FAILED and its message, without stopping the others (what it wrote stays, as when
 * a script alone fails midway). A nil reply comes back as false (Redis's nil), so the reply array
 * keeps one element per call.
 */
function turnScript(scripts: Readonly<Record<string, string>>): string {
  const fns = Object.entries(scripts)
    .map(([name, text]) => `S[${JSON.stringify(name)}] = function(KEYS, ARGV)\n${text}\nend`)
    .join('\n')
  return `local S = {}
${fns}
local out = {}
local k, a = 1, 2
for c = 1, tonumber(ARGV[1]) do
  local name, nk, na = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local keys, argv = {}, {}
  for i = 1, nk do keys[i] = KEYS[k]; k = k + 1 end
  for i = 1, na do argv[i] = ARGV[a]; a = a + 1 end
  local ok, r = pcall(S[name], keys, argv)
  if not ok then r = ${JSON.stringify(FAILED)} .. tostring(r) elseif r == nil then r = false end
  out[c] = r
end
return out
`
}
