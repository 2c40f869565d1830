import { realpathSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { reexecTuned, startsRouter } from './tuned-runtime.ts'

// main.ts's first import, so that it runs before any other module of the router is evaluated: a
// router started without its runtime setting starts again in place at once (tuned-runtime.ts),
// without evaluating the rest twice. Only when main.ts is the process's entry (inside the
// executable the entry is always main.ts; from the sources, main.ts by any link to it).
const real = (p: string) => {
  try {
    return realpathSync(p)
  } catch {
    return p
  }
}
const entry =
  Bun.main.startsWith('/$bunfs/') ||
  real(Bun.main) === real(fileURLToPath(new URL('../main.ts', import.meta.url)))
if (entry && startsRouter(process.argv.slice(2))) reexecTuned()
