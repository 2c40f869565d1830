import { join } from 'node:path'

/** The console's script and styles, bundled for browsers and minified. */
export interface ConsoleBundle {
  readonly js: Uint8Array<ArrayBuffer>
  readonly css: Uint8Array<ArrayBuffer>
}

/**
 * Bundles console/app (Preact, htm, uPlot and the pages) with Bun's bundler. `bun run build` runs
 * it (scripts/build-console.ts) before compiling, and the executable embeds the result; run from
 * source, the server calls it at the first request for the console instead.
 */
export async function buildConsole(): Promise<ConsoleBundle> {
  const result = await Bun.build({
    entrypoints: [join(import.meta.dir, 'app', 'main.ts')],
    target: 'browser',
    format: 'esm',
    minify: true,
    define: { 'process.env.NODE_ENV': '"production"' },
  })
  if (!result.success) throw new AggregateError(result.logs, 'the console bundle failed to build')
  const js = result.outputs.find((o) => o.kind === 'entry-point')
  const css = result.outputs.find((o) => o.path.endsWith('.css'))
  if (!js || !css) throw new Error('the console bundle lacks its script or its styles')
  return { js: new Uint8Array(await js.arrayBuffer()), css: new Uint8Array(await css.arrayBuffer()) }
}
