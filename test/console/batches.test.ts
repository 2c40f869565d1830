import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Browser } from 'playwright-core'
import { consoleSignIn, haveChromium, launchChromium, watchedPage } from '../helpers/browser.ts'
import { startTropa, type Tropa } from '../helpers/start.ts'

// A batch uploaded in the console runs to completion while the page follows it: one slow node,
// one line at a time, so the progress bar is seen between empty and full.
let t: Tropa
let browser: Browser
beforeAll(async () => {
  if (!haveChromium) return
  t = await startTropa({
    nodes: [{ name: 'sim-slow', timeScale: 1, itlMs: 20, seed: 1 }],
    extra: { batches: { tick_ms: 50, workers: 1, concurrency: 1 } },
  })
  browser = await launchChromium()
})
afterAll(async () => {
  if (!haveChromium) return
  await browser.close()
  await t.stop()
})

describe.skipIf(!haveChromium)('Batches in the console', () => {
  test('a JSONL upload becomes a batch whose progress bar moves to full; its output downloads', async () => {
    const lines = Array.from({ length: 8 }, (_, i) =>
      JSON.stringify({
        custom_id: `line-${i}`,
        method: 'POST',
        url: '/v1/chat/completions',
        body: { model: 'test/chat', messages: [{ role: 'user', content: `question ${i}` }], max_tokens: 20 },
      }),
    )
    const file = join(t.dir, 'questions.jsonl')
    writeFileSync(file, `${lines.join('\n')}\n`)
    const ctx = await browser.newContext({ viewport: { width: 1100, height: 700 } })
    const w = await watchedPage(ctx, t.url)
    await consoleSignIn(w, t.url, t.masterKey)
    await w.page.getByRole('link', { name: 'Batches' }).click()
    await w.page.getByLabel('JSONL file').setInputFiles(file)
    await w.page.getByRole('button', { name: 'Create a batch' }).click()
    const row = w.page.locator('tr[data-batch]')
    await row.waitFor()
    // The bar as the page shows it, sampled until the batch is done (no reload: the page polls).
    const seen: number[] = []
    const deadline = Date.now() + 30_000
    while (Date.now() < deadline) {
      seen.push(Number(await row.getByRole('progressbar').getAttribute('aria-valuenow')))
      if ((await row.getAttribute('data-status')) === 'completed') break
      await Bun.sleep(100)
    }
    expect(await row.getAttribute('data-status')).toBe('completed')
    expect(await row.getByTestId('counts').textContent()).toBe('8 / 0 / 8')
    // Read after the status: the two are read apart, and a render may fall between them.
    seen.push(Number(await row.getByRole('progressbar').getAttribute('aria-valuenow')))
    expect(seen.at(-1)).toBe(100)
    expect(seen.some((v) => v > 0 && v < 100)).toBe(true)
    expect(seen.every((v, i) => i === 0 || v >= seen[i - 1]!)).toBe(true)
    const [download] = await Promise.all([
      w.page.waitForEvent('download'),
      row.getByRole('link', { name: 'Output' }).click(),
    ])
    const output = (await Bun.file((await download.path())!).text()).trim().split('\n')
    expect(output.length).toBe(8)
    expect(output.map((l) => (JSON.parse(l) as { custom_id: string }).custom_id).sort()).toEqual(
      lines.map((_, i) => `line-${i}`).sort(),
    )
    expect(w.problems).toEqual([])
    await ctx.close()
  }, 60_000)
})
