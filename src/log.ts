/** Where Tropa's log lines go: one function, JSON lines by default. Imported by any layer. */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error'
export type Log = (level: LogLevel, msg: string, fields?: Record<string, unknown>) => void

const ORDER: Record<LogLevel, number> = { debug: 0, info: 1, warn: 2, error: 3 }

/** JSON lines on stderr at or above `level`. */
export function consoleLog(level: LogLevel): Log {
  return (l, msg, fields) => {
    if (ORDER[l] < ORDER[level]) return
    process.stderr.write(`${JSON.stringify({ t: new Date().toISOString(), level: l, msg, ...fields })}\n`)
  }
}

/**
 * Runs `stop` on each of `signals` (a graceful stop); a stop that throws is logged and the
 * process exits 1. The router's own process and a workers' primary stop this way.
 */
export function stopOn(
  signals: readonly NodeJS.Signals[],
  stop: (signal: string) => Promise<void>,
  log: Log,
): void {
  const onSignal = (signal: string) =>
    stop(signal).catch((err) => {
      log('error', 'stopping failed', { error: String((err as Error)?.stack ?? err) })
      process.exit(1)
    })
  for (const s of signals) process.on(s, () => void onSignal(s))
}
