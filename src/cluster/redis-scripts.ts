import { RedisClient } from 'bun'

/**
 * A Redis connection that runs named Lua scripts: by their text (EVAL) until Redis has run them
 * on this connection, then by their SHA (computed here). Every call goes out the moment it is
 * made, so Redis runs them in the order made: the shared meter sends one turn's settlements before
 * its reservations and relies on it (a first use that waited for a `SCRIPT LOAD` was overtaken by
 * a later call of a script already known). After a reconnection the texts are sent again; if Redis
 * forgot a script without a reconnection (`SCRIPT FLUSH`), the call that finds out is sent again
 * with the text. Once connected, a lost connection fails a call at once (the client reconnects in
 * the background), so a request is refused rather than left waiting.
 */
export class RedisScripts<Name extends string> {
  readonly redis: RedisClient
  private readonly sha: Record<Name, string>
  /** Scripts Redis has run on this connection (so it holds them). */
  private readonly loaded = new Set<Name>()
  private connectedOnce = false

  constructor(
    url: string,
    private readonly scripts: Readonly<Record<Name, string>>,
  ) {
    this.redis = new RedisClient(url, {
      autoReconnect: true,
      maxRetries: 1_000_000,
      enableOfflineQueue: false,
      connectionTimeout: 2000,
    })
    this.sha = Object.fromEntries(
      Object.entries<string>(scripts).map(([name, text]) => [
        name,
        new Bun.CryptoHasher('sha1').update(text).digest('hex'),
      ]),
    ) as Record<Name, string>
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
  async reply(name: Name, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    if (!this.redis.connected) {
      if (this.connectedOnce) throw new Error('Redis is not connected')
      await this.redis.connect()
      this.connectedOnce = true
    }
    if (!this.loaded.has(name)) {
      // EVAL runs the text and keeps it, so the next EVALSHA finds it.
      const out = await this.redis.send('EVAL', [this.scripts[name], String(keys.length), ...keys, ...args])
      this.loaded.add(name)
      return out
    }
    try {
      return await this.redis.send('EVALSHA', [this.sha[name], String(keys.length), ...keys, ...args])
    } catch (err) {
      if (!String((err as Error).message).includes('NOSCRIPT')) throw err
      return await this.redis.send('EVAL', [this.scripts[name], String(keys.length), ...keys, ...args])
    }
  }
}
