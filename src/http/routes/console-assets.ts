import { buildConsole, type ConsoleBundle } from '../../../console/build.ts'

interface Asset {
  readonly body: Uint8Array<ArrayBuffer>
  readonly type: string
}
/** The console's page and its hashed assets. */
export interface ConsoleAssets {
  readonly page: string
  readonly files: ReadonlyMap<string, Asset>
}

/** Inside the executable, Bun's embedded file system holds the program as /$bunfs/... */
const compiled = () => Bun.main.startsWith('/$bunfs/') || Bun.main.startsWith('B:/~BUN/')

/**
 * The bundle `bun run build` wrote to dist/console/ and `bun build --compile` embedded (imported
 * `with { type: 'file' }`: paths inside the executable). Only the executable reads it: run from
 * source, the bundle is built afresh, so it is never stale.
 */
async function embedded(): Promise<ConsoleBundle> {
  const js = await import('../../../dist/console/console.js', { with: { type: 'file' } })
  const css = await import('../../../dist/console/console.css', { with: { type: 'file' } })
  return { js: await Bun.file(js.default).bytes(), css: await Bun.file(css.default).bytes() }
}

/** Loads (or builds) the bundle and names each file by its content's hash, so browsers cache it for good. */
export async function consoleAssets(): Promise<ConsoleAssets> {
  const bundle = compiled() ? await embedded() : await buildConsole()
  const files = new Map<string, Asset>()
  const add = (stem: string, ext: string, body: Uint8Array<ArrayBuffer>, type: string) => {
    const hash = new Bun.CryptoHasher('sha256').update(body).digest('hex').slice(0, 16)
    const name = `${stem}.${hash}.${ext}`
    files.set(name, { body, type })
    return `/console/assets/${name}`
  }
  const css = add('console', 'css', bundle.css, 'text/css; charset=utf-8')
  const js = add('console', 'js', bundle.js, 'text/javascript; charset=utf-8')
  const page = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tropa console</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="${css}">
<script type="module" src="${js}"></script>
</head>
<body>
<div id="app"></div>
</body>
</html>
`
  return { page, files }
}
