import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { buildConsole } from '../console/build.ts'

// `bun run build` runs this first: the executable embeds dist/console/ (see
// src/http/routes/console-assets.ts).
const out = join(import.meta.dir, '..', 'dist', 'console')
mkdirSync(out, { recursive: true })
const { js, css } = await buildConsole()
writeFileSync(join(out, 'console.js'), js)
writeFileSync(join(out, 'console.css'), css)
console.log(`console: ${js.length} bytes of script, ${css.length} bytes of styles`)
