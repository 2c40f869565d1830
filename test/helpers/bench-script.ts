import { expect } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'

const root = resolve(import.meta.dir, '../..')

/**
 * Runs a benchmark script from the repository root with `--json <tmp file>` appended, expects it
 * to exit 0 (printing its stderr tail if not), and returns its stdout and parsed JSON.
 */
export async function runBenchScript<T>(
  args: readonly string[],
  env?: Record<string, string>,
): Promise<{ out: string; json: T }> {
  const dir = mkdtempSync(join(tmpdir(), 'tropa-bench-script-'))
  try {
    const file = join(dir, 'out.json')
    const proc = Bun.spawn([process.execPath, ...args, '--json', file], {
      cwd: root,
      ...(env && { env }),
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const [out, err] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text()])
    const code = await proc.exited
    if (code !== 0) console.error(err.slice(-3000))
    expect(code).toBe(0)
    return { out, json: JSON.parse(readFileSync(file, 'utf8')) as T }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
