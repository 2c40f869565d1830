import { PermissionDenied, sessionRequired, TropaError } from '../errors.ts'
import { randomBase62 } from '../ids.ts'
import type { ConsoleSessionRecord, Store } from '../storage/store.ts'
import type { Principal } from './live.ts'
import { hashSecret } from './secrets.ts'
import type { IdentityService } from './service.ts'

/** A console session resolved: who it acts as, and the value its state-changing calls echo. */
export interface ConsoleSession {
  readonly record: ConsoleSessionRecord
  readonly principal: Principal
}

/** Sessions are marked used at most this often, so reading pages does not write on every call. */
const TOUCH_EVERY_SEC = 60

/**
 * Console sign-in: a master key (its organization) or the admin token becomes a session kept in
 * the store, so every node of a cluster knows it and it survives a restart. The browser holds
 * only a random session id (in an HttpOnly cookie); the store holds its SHA-256, and never the
 * token that signed in. A session idle past `idleSec` is gone; a master key revoked or disabled
 * since ends its sessions at their next use.
 */
export class ConsoleSessions {
  constructor(
    private readonly store: Store,
    private readonly identity: IdentityService,
    readonly idleSec: number,
    private readonly now: () => number = () => Math.floor(Date.now() / 1000),
  ) {}

  /** Signs in with a token; returns the cookie value (shown to no one else) and the session. */
  async create(token: string): Promise<{ cookie: string; session: ConsoleSession }> {
    const principal = await this.identity.authenticateShared(`Bearer ${token}`)
    if (principal.kind === 'api')
      throw new PermissionDenied(
        "an API key (sk-...) cannot sign in to the console: use the organization's master key (mk-...)",
      )
    const at = this.now()
    // Sessions nobody ends (a browser closed) expire; a few are swept at each sign-in.
    await this.store.deleteConsoleSessionsIdleBefore(at - this.idleSec, 100)
    const cookie = randomBase62(43)
    const record: ConsoleSessionRecord = {
      id: hashSecret(cookie),
      kind: principal.kind,
      keyId: principal.kind === 'master' ? principal.key.id : null,
      csrf: randomBase62(32),
      createdAt: at,
      lastSeenAt: at,
    }
    await this.store.insertConsoleSession(record)
    return { cookie, session: { record, principal } }
  }

  /** The session of a cookie value; 401 session_required when absent, expired or its key is gone. */
  async resolve(cookie: string | undefined): Promise<ConsoleSession> {
    if (!cookie || cookie.length > 128) throw sessionRequired()
    const id = hashSecret(cookie)
    const record = await this.store.getConsoleSession(id)
    if (!record) throw sessionRequired()
    const at = this.now()
    if (record.lastSeenAt + this.idleSec < at) {
      await this.store.deleteConsoleSession(id)
      throw sessionRequired()
    }
    let principal: Principal
    if (record.keyId === null) principal = { kind: 'admin' }
    else
      try {
        principal = await this.identity.principalOfKey(record.keyId)
      } catch (err) {
        if (err instanceof TropaError && err.status === 401) {
          await this.store.deleteConsoleSession(id)
          throw sessionRequired()
        }
        throw err
      }
    if (at - record.lastSeenAt >= TOUCH_EVERY_SEC) await this.store.touchConsoleSession(id, at)
    return { record, principal }
  }

  /** Logout: the session is deleted from the store (every node refuses it from now on). */
  async end(cookie: string): Promise<void> {
    await this.store.deleteConsoleSession(hashSecret(cookie))
  }
}
