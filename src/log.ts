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
