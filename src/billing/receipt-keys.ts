import { createCipheriv, createDecipheriv, generateKeyPairSync, hkdfSync, randomBytes } from 'node:crypto'
import { sortableId } from '../ids.ts'
import type { Log } from '../log.ts'
import type { LedgerEntry, ReceiptKeyRecord, Store } from '../storage/store.ts'
import type { ReceiptSigner } from './receipt-signer.ts'
import { type ReceiptClaims, type ReceiptKeySet, receiptCount } from './receipts.ts'

/** The AES-256-GCM key that seals receipt keys in the store: HKDF-SHA256 of server.secret. */
function sealingKey(secret: string): Buffer {
  return Buffer.from(hkdfSync('sha256', secret, 'tropa', 'receipt signing keys v1', 32))
}

/** A private key as stored: `v1.<iv>.<ciphertext>.<tag>` (base64url), its kid authenticated too. */
export function sealKey(der: Uint8Array, kid: string, secret: string): string {
  const iv = randomBytes(12)
  const c = createCipheriv('aes-256-gcm', sealingKey(secret), iv)
  c.setAAD(Buffer.from(kid))
  const ct = Buffer.concat([c.update(der), c.final()])
  return `v1.${iv.toString('base64url')}.${ct.toString('base64url')}.${c.getAuthTag().toString('base64url')}`
}

/** The PKCS #8 key sealed by sealKey; throws when the secret (or the kid) is not the one it was sealed with. */
export function openKey(sealed: string, kid: string, secret: string): Buffer {
  const [v, iv, ct, tag] = sealed.split('.')
  if (v !== 'v1' || !iv || ct === undefined || !tag) throw new Error('not a sealed receipt key')
  const d = createDecipheriv('aes-256-gcm', sealingKey(secret), Buffer.from(iv, 'base64url'))
  d.setAAD(Buffer.from(kid))
  d.setAuthTag(Buffer.from(tag, 'base64url'))
  return Buffer.concat([d.update(Buffer.from(ct, 'base64url')), d.final()])
}

/** A new key of this generation, sealed. */
export function newReceiptKey(generation: number, secret: string, nowSec: number): ReceiptKeyRecord {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519')
  const kid = `rk_${sortableId()}`
  const der = privateKey.export({ format: 'der', type: 'pkcs8' })
  const jwk = publicKey.export({ format: 'jwk' }) as { x: string }
  return { kid, generation, publicKey: jwk.x, privateKey: sealKey(der, kid, secret), createdAt: nowSec }
}

/**
 * The receipt keys of the store and the signer that uses them. The newest generation this node
 * can open signs; every key is published, so receipts signed before a rotation still verify. In a
 * cluster the keys live in PostgreSQL: a rotation on one node is announced on the bus (the others
 * read the store again), and every node re-reads it each `refreshMs` in case it missed that.
 */
export class Receipts {
  private records: ReceiptKeyRecord[] = []
  private opened = new Map<string, Buffer>()
  private signing: string | undefined
  private keySetJson = '{"keys":[],"current_kid":null}'
  private timer: ReturnType<typeof setInterval> | undefined
  private loading: Promise<void> | undefined

  private constructor(
    /** Every billed response is signed (receipts.responses); else only exports carry receipts. */
    readonly responses: boolean,
    private readonly store: Store,
    private readonly secret: string,
    private readonly signer: ReceiptSigner,
    private readonly log: Log,
    /** Tells the other nodes the keys changed (the cluster bus); absent on one node. */
    private readonly announce: (() => Promise<unknown>) | undefined,
  ) {}

  /** Reads the keys (making the first one when there is none) and starts the refresh. */
  static async open(
    responses: boolean,
    store: Store,
    secret: string,
    signer: ReceiptSigner,
    log: Log,
    announce?: () => Promise<unknown>,
    refreshMs = 60_000,
  ): Promise<Receipts> {
    const r = new Receipts(responses, store, secret, signer, log, announce)
    await r.reload()
    // No key yet, or none this node can open (server.secret changed): a new one signs from now.
    if (r.signing === undefined) await r.rotate(false)
    r.timer = setInterval(() => void r.reload().catch(() => {}), refreshMs)
    r.timer.unref?.()
    return r
  }

  /** The kid new receipts are signed with (a ledger row records it); undefined: none can sign. */
  get kid(): string | undefined {
    return this.signing
  }

  /** /.well-known/tropa-receipts.json's body. */
  keySetText(): string {
    return this.keySetJson
  }

  keySet(): ReceiptKeySet {
    return JSON.parse(this.keySetJson) as ReceiptKeySet
  }

  /** A billed request's receipt (undefined when it could not be signed). */
  sign(kid: string, c: ReceiptClaims): Promise<string | undefined> {
    return this.signer.sign(kid, c)
  }

  /**
   * The receipts of ledger rows, re-signed with the keys that signed them (null for a row
   * without a receipt key, or one whose key this node cannot open).
   */
  async signRows(rows: readonly LedgerEntry[]): Promise<(string | null)[]> {
    const out: (string | null)[] = rows.map(() => null)
    const items: { kid: string; claims: ReceiptClaims }[] = []
    const at: number[] = []
    let reread = false
    for (let i = 0; i < rows.length; i++) {
      const e = rows[i]!
      if (!e.receiptKid || e.kind !== 'usage' || e.keyId === null || e.model === null) continue
      // A key made on another node a moment ago: read the store once before giving up on it.
      if (!reread && !this.opened.has(e.receiptKid) && !this.records.some((k) => k.kid === e.receiptKid)) {
        reread = true
        await this.reload().catch(() => {})
      }
      if (!this.opened.has(e.receiptKid)) continue
      at.push(i)
      items.push({ kid: e.receiptKid, claims: claimsOfRow(e) })
    }
    const signed = await this.signer.signMany(items)
    for (let j = 0; j < at.length; j++) out[at[j]!] = signed[j] ?? null
    return out
  }

  /**
   * Makes a new key (the next generation) the signing key; the old ones stay published. Two
   * nodes rotating at once make one key between them (the generation is unique in the store).
   */
  async rotate(tell = true): Promise<string | undefined> {
    const next = (this.records.at(-1)?.generation ?? 0) + 1
    const k = newReceiptKey(next, this.secret, Math.floor(Date.now() / 1000))
    const added = await this.store.addReceiptKey(k)
    await this.reload()
    if (added) this.log('info', 'receipt key rotated', { kid: k.kid, generation: next })
    if (tell && this.announce) await this.announce().catch(() => {})
    return this.signing
  }

  /** Reads the keys from the store again (another node rotated). */
  reload(): Promise<void> {
    this.loading ??= this.load().finally(() => {
      this.loading = undefined
    })
    return this.loading
  }

  private async load(): Promise<void> {
    const records = await this.store.receiptKeys()
    let changed = records.length !== this.records.length
    for (const k of records) {
      if (this.opened.has(k.kid)) continue
      try {
        this.opened.set(k.kid, openKey(k.privateKey, k.kid, this.secret))
        changed = true
      } catch {
        if (!this.records.some((r) => r.kid === k.kid))
          this.log(
            'error',
            'a receipt key cannot be opened with this server.secret; its rows are exported without receipts',
            {
              kid: k.kid,
            },
          )
      }
    }
    this.records = records
    const usable = records.filter((k) => this.opened.has(k.kid))
    this.signing = usable.at(-1)?.kid
    if (!changed) return
    this.signer.useKeys(usable.map((k) => ({ kid: k.kid, der: new Uint8Array(this.opened.get(k.kid)!) })))
    const set: ReceiptKeySet = {
      keys: records.map((k) => ({
        kty: 'OKP',
        crv: 'Ed25519',
        x: k.publicKey,
        kid: k.kid,
        alg: 'EdDSA',
        use: 'sig',
        created_at: k.createdAt,
      })),
      current_kid: this.signing ?? null,
    }
    this.keySetJson = JSON.stringify(set)
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.signer.close()
  }
}

/** A ledger row's receipt claims (the same a response's receipt was signed with). */
export function claimsOfRow(e: LedgerEntry): ReceiptClaims {
  return {
    requestId: e.requestId,
    orgId: e.orgId,
    keyId: e.keyId ?? '',
    model: e.model ?? '',
    promptTokens: e.promptTokens,
    cachedTokens: receiptCount(e.cachedTokens),
    completionTokens: e.completionTokens,
    costNano: e.costNano,
    endedAtMs: e.endedAtMs,
  }
}
