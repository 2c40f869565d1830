import { RedisClient } from 'bun'

/**
 * A Redis connection that runs named Lua scripts by their SHA, loading a script again when
 * Redis restarted and forgot it. Once connected, a lost connection fails a call at once (the
 * client reconnects in the background), so a request is refused rather than left waiting.
 */
export class RedisScripts<Name extends string> {
  readonly redis: RedisClient
  private readonly sha = new Map<Name, string>()
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
    let sha = this.sha.get(name) ?? (await this.load(name))
    try {
      return await this.redis.send('EVALSHA', [sha, String(keys.length), ...keys, ...args])
    } catch (err) {
      if (!String((err as Error).message).includes('NOSCRIPT')) throw err
      sha = await this.load(name)
      return await this.redis.send('EVALSHA', [sha, String(keys.length), ...keys, ...args])
    }
  }

  private async load(name: Name): Promise<string> {
    const sha = String(await this.redis.send('SCRIPT', ['LOAD', this.scripts[name]]))
    this.sha.set(name, sha)
    return sha
  }
}
