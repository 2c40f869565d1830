/**
 * The streams being relayed, so that a graceful stop can end the ones still open at its deadline
 * (each with one error event, billed for what it was sent) instead of cutting their sockets.
 * Adding and removing one is a Set operation per stream.
 */
export class OpenStreams {
  private readonly ends = new Set<() => void>()

  /** Registers a stream still open; `end` finishes it cleanly. */
  add(end: () => void): void {
    this.ends.add(end)
  }

  delete(end: () => void): void {
    this.ends.delete(end)
  }

  get size(): number {
    return this.ends.size
  }

  /** Ends every stream still open; returns how many there were. */
  endAll(): number {
    const ends = [...this.ends]
    this.ends.clear()
    for (const end of ends) end()
    return ends.length
  }
}
