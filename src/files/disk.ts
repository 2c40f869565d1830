import { isDiskFull } from '../errors.ts'

/**
 * Whether the data directory's disk has room: set by any write that failed with ENOSPC (or a full
 * quota, or SQLite's "database or disk is full"), cleared by the next write that succeeds or by a
 * probe that tries a small write every `probeMs` while the disk is full, so `/ready` turns green
 * again by itself once space is freed even when no client tries.
 */
export class DiskWatch {
  private fullSince: number | undefined
  private timer: ReturnType<typeof setInterval> | undefined
  private probing = false

  constructor(
    /** Writes (and removes) a small file where the failed writes went: FileStore.probe. */
    private readonly tryWrite: () => Promise<void>,
    private readonly onChange: (full: boolean, detail?: string) => void = () => {},
    private readonly probeMs = 1000,
  ) {}

  /** Unix ms since which the disk has been full, or undefined while it has room. */
  get full(): number | undefined {
    return this.fullSince
  }

  /** Looks at a failed write's error: true (and the disk marked full) when it was a full disk. */
  report(err: unknown): boolean {
    if (!isDiskFull(err)) return false
    if (this.fullSince === undefined) {
      this.fullSince = Date.now()
      this.onChange(true, String((err as Error)?.message ?? err).slice(0, 200))
    }
    this.timer ??= setInterval(() => void this.probe(), this.probeMs)
    this.timer.unref?.()
    return true
  }

  /** A write succeeded: the disk has room. */
  ok(): void {
    if (this.fullSince === undefined) return
    this.fullSince = undefined
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
    this.onChange(false)
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
  }

  private async probe(): Promise<void> {
    if (this.probing) return
    this.probing = true
    try {
      await this.tryWrite()
      this.ok()
    } catch (err) {
      if (!isDiskFull(err)) this.ok() // another failure (permissions...) is not this watch's to report
    } finally {
      this.probing = false
    }
  }
}
