const t0 = performance.now()

/** Progress on stderr (stdout carries the tables), with seconds since the start. */
export function log(msg: string): void {
  process.stderr.write(`[bench ${((performance.now() - t0) / 1000).toFixed(1).padStart(6)} s] ${msg}\n`)
}
