/**
 * Several processes' Prometheus texts as one: every series gets a `worker` label (a worker's
 * number, or "primary"), and each family's series are written together under its HELP and TYPE
 * (the text format wants a family in one group). A scrape reaches one worker, which asks the
 * primary for everyone's text and answers with this.
 */
export function mergeMetrics(parts: readonly { readonly worker: string; readonly text: string }[]): string {
  const families = new Map<string, { help?: string; type?: string; series: string[] }>()
  const family = (name: string) => {
    let f = families.get(name)
    if (!f) {
      f = { series: [] }
      families.set(name, f)
    }
    return f
  }
  const typed = new Set<string>()
  for (const { text } of parts)
    for (const line of text.split('\n')) {
      const m = /^# TYPE (\S+) /.exec(line)
      if (m) typed.add(m[1]!)
    }
  /** The family a series belongs to: its own name, or a histogram's or summary's base. */
  const familyOf = (name: string) => {
    if (typed.has(name)) return name
    for (const suffix of ['_bucket', '_sum', '_count'])
      if (name.endsWith(suffix) && typed.has(name.slice(0, -suffix.length)))
        return name.slice(0, -suffix.length)
    return name
  }
  for (const { worker, text } of parts) {
    const label = `worker="${worker}"`
    for (const line of text.split('\n')) {
      if (line.length === 0) continue
      const meta = /^# (HELP|TYPE) (\S+) /.exec(line)
      if (meta) {
        const f = family(meta[2]!)
        if (meta[1] === 'HELP') f.help ??= line
        else f.type ??= line
        continue
      }
      if (line.startsWith('#')) continue
      const brace = line.indexOf('{')
      const space = line.indexOf(' ')
      const name = brace >= 0 && brace < space ? line.slice(0, brace) : line.slice(0, space)
      const labelled =
        brace >= 0 && brace < space
          ? line[brace + 1] === '}'
            ? `${name}{${label}}${line.slice(brace + 2)}`
            : `${name}{${label},${line.slice(brace + 1)}`
          : `${name}{${label}}${line.slice(space)}`
      family(familyOf(name)).series.push(labelled)
    }
  }
  const out: string[] = []
  for (const f of families.values()) {
    if (f.help) out.push(f.help)
    if (f.type) out.push(f.type)
    out.push(...f.series)
  }
  return `${out.join('\n')}\n`
}
