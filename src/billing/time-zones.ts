// Wall-clock fields of an instant in a time zone, for the usage series' local days and for budget
// periods: one Intl formatter per zone, kept.

const formatters = new Map<string, Intl.DateTimeFormat>()

/** A formatter of wall-clock fields in `tz` (throws RangeError for a zone the runtime does not know). */
export function zoneFormatter(tz: string): Intl.DateTimeFormat {
  let f = formatters.get(tz)
  if (!f) {
    f = new Intl.DateTimeFormat('en-US', {
      timeZone: tz,
      hourCycle: 'h23',
      year: 'numeric',
      month: 'numeric',
      day: 'numeric',
      hour: 'numeric',
      minute: 'numeric',
      second: 'numeric',
      weekday: 'short',
    })
    // Zones are a closed set (a few hundred); the bound only keeps a hostile caller from growing it.
    if (formatters.size < 1024) formatters.set(tz, f)
  }
  return f
}
