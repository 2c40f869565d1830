import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import axe from 'axe-core'
import OpenAI from 'openai'
import type { Browser, BrowserContext, Page } from 'playwright-core'
import {
  CHROMIUM,
  consoleSignIn,
  haveChromium,
  launchChromium,
  type Watched,
  watchedPage,
} from '../helpers/browser.ts'
import { ADMIN_TOKEN, startTropa, type Tropa } from '../helpers/start.ts'

// The console in a real browser: an organization and an operator use it as people would, the
// page talks to nothing but Tropa, logs no error, and passes axe-core on every page.
// CONSOLE_SCREENSHOTS=1 also writes every page in both languages to docs/console/.
if (!haveChromium)
  console.warn(`SKIPPED the console in a browser: no ${CHROMIUM} here (apt-get install -y chromium)`)
const SHOTS =
  process.env.CONSOLE_SCREENSHOTS === '1' ? join(import.meta.dir, '../../docs/console') : undefined

let t: Tropa
let browser: Browser
beforeAll(async () => {
  if (!haveChromium) return
  t = await startTropa()
  browser = await launchChromium()
})
afterAll(async () => {
  if (!haveChromium) return
  await browser.close()
  await t.stop()
})

const open = (ctx: BrowserContext) => watchedPage(ctx, t.url)

const newContext = (opts: Parameters<Browser['newContext']>[0] = {}) =>
  browser.newContext({ viewport: { width: 1100, height: 700 }, ...opts })

const signIn = (w: Watched, token: string) => consoleSignIn(w, t.url, token)

/** axe-core in the page (evaluated through the debugging protocol: the page's CSP forbids inline script). */
async function accessibility(page: Page): Promise<string[]> {
  await page.evaluate(axe.source)
  const result = (await page.evaluate("axe.run(document, { resultTypes: ['violations'] })")) as axe.AxeResults
  return result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`)
}

async function visit(w: Watched, hash: string, lang: 'en' | 'ru', ready: string, settleMs = 0, name = hash) {
  w.leaving = true
  await w.page.evaluate((l) => localStorage.setItem('tropa.lang', l), lang)
  await w.page.goto('about:blank')
  await w.page.goto(`${t.url}/console#/${hash}`)
  w.leaving = false
  await w.page.locator(ready).first().waitFor()
  await Bun.sleep(settleMs)
  await w.page.waitForLoadState('networkidle')
  expect(await w.page.evaluate('document.documentElement.lang')).toBe(lang)
  expect(await accessibility(w.page)).toEqual([])
  // Usable at phone width: nothing but the tables' own scroll boxes is wider than the screen.
  await w.page.setViewportSize({ width: 390, height: 800 })
  // Browser code as text: the tests are type-checked without the DOM's types.
  const wideNow = () =>
    w.page.evaluate(`[...document.querySelectorAll('body *')]
    .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1 && !e.closest('.scroll'))
    .map((e) => e.tagName + '.' + e.className)`) as Promise<string[]>
  // The chart follows its box through a ResizeObserver, a frame or more after the viewport
  // changes (on a loaded machine, several): what is still too wide after 2 s does not fit.
  let wide = await wideNow()
  for (let i = 0; i < 40 && wide.length > 0; i++) {
    await Bun.sleep(50)
    wide = await wideNow()
  }
  expect({ page: hash, wide }).toEqual({ page: hash, wide: [] })
  await w.page.setViewportSize({ width: 1100, height: 700 })
  if (SHOTS) {
    mkdirSync(SHOTS, { recursive: true })
    await w.page.screenshot({ path: join(SHOTS, `${name}-${lang}.png`) })
  }
}

describe.skipIf(!haveChromium)('the console in a browser', () => {
  test('a wrong token shows a clear error; an API key is told to use the master key', async () => {
    const ctx = await newContext()
    const w = await open(ctx)
    await w.page.goto(`${t.url}/`)
    expect(w.page.url()).toBe(`${t.url}/console`)
    await w.page.getByLabel(/master key or admin token/i).fill('mk-wrong')
    await w.page.locator('form button[type=submit]').click()
    await expect(w.page.getByRole('alert').textContent()).resolves.toContain('This token is not valid')
    await w.page.getByLabel(/master key or admin token/i).fill(t.apiKey)
    await w.page.locator('form button[type=submit]').click()
    await w.page.getByRole('alert').filter({ hasText: 'API keys' }).waitFor()
    expect(await ctx.cookies()).toEqual([])
    // The only problems: the two refusals the page showed (Chromium logs each refused request).
    expect(
      w.problems.filter(
        (p) => !p.startsWith('HTTP') && !/Failed to load resource: .* status of 40[13]/.test(p),
      ),
    ).toEqual([])
    expect(w.problems.filter((p) => p.startsWith('HTTP'))).toEqual([
      `HTTP 401: POST ${t.url}/console/session`,
      `HTTP 403: POST ${t.url}/console/session`,
    ])
    if (SHOTS) {
      await w.page.screenshot({ path: join(SHOTS, 'signin-en.png') })
      await w.page.locator('button.lang').click()
      await w.page.screenshot({ path: join(SHOTS, 'signin-ru.png') })
    }
    await ctx.close()
  })

  test('an organization creates a key, copies it, uses it, sees it in Activity and the chart, revokes it: 401', async () => {
    const ctx = await newContext()
    await ctx.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: t.url })
    const w = await open(ctx)
    await signIn(w, t.masterKey)
    await w.page.getByRole('heading', { level: 1, name: 'Overview' }).waitFor()

    // The cookie: HttpOnly (no script reads it), SameSite=Strict, only for /console; the token is
    // in no browser storage.
    const cookies = await ctx.cookies()
    expect(cookies.length).toBe(1)
    expect(cookies[0]).toMatchObject({
      name: 'tropa_console',
      httpOnly: true,
      sameSite: 'Strict',
      path: '/console',
    })
    expect(cookies[0]!.secure).toBe(false) // plain HTTP here; Secure over TLS (session.test.ts)
    const stored = await w.page.evaluate<string>(
      'JSON.stringify({ ...localStorage, ...sessionStorage }) + document.cookie',
    )
    expect(stored).not.toContain('mk-')
    expect(stored).not.toContain('tropa_console')

    await w.page.getByRole('link', { name: 'Keys' }).click()
    await w.page.getByRole('form', { name: 'Create a key' }).getByLabel('Name').fill('console-key')
    await w.page.getByRole('form', { name: 'Create a key' }).getByLabel(/Limit/).fill('5')
    await w.page.getByRole('button', { name: 'Create a key' }).click()
    const secret = (await w.page.getByTestId('secret').textContent())!
    expect(secret).toMatch(/^sk-[0-9A-Za-z]{43}$/)
    await w.page.getByRole('button', { name: 'Copy' }).click()
    await w.page.getByRole('button', { name: 'Copied' }).waitFor()
    expect(await w.page.evaluate('navigator.clipboard.readText()')).toBe(secret)
    await w.page.getByRole('button', { name: 'Done' }).click()
    const row = w.page.locator('tr[data-key="console-key"]')
    await expect(row.textContent()).resolves.toContain('active')

    // The copied key works through the official SDK.
    const client = new OpenAI({ baseURL: t.baseURL, apiKey: secret, maxRetries: 0 })
    const done = await client.chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'hello from the console test' }],
    })
    expect(done.choices[0]!.message.content!.length).toBeGreaterThan(0)

    await w.page.getByRole('link', { name: 'Activity' }).click()
    const activity = w.page.locator('tbody tr', { hasText: 'console-key' })
    await activity.first().waitFor()
    expect(await activity.count()).toBe(1)
    await expect(activity.first().textContent()).resolves.toContain('test/chat')
    // Filtered by the key, the CSV download has that request.
    await w.page.locator('select[name=key_id]').selectOption({ label: 'console-key' })
    await w.page.getByRole('button', { name: 'Apply' }).click()
    await w.page.locator('tbody tr').first().waitFor()
    expect(await w.page.locator('tbody tr').count()).toBe(1)
    const [download] = await Promise.all([
      w.page.waitForEvent('download'),
      w.page.getByRole('link', { name: 'Download CSV' }).click(),
    ])
    const csv = await Bun.file((await download.path())!).text()
    expect(csv.split('\n')[0]).toStartWith('request_id,')
    expect(csv).toContain('console-key')
    expect(csv.trim().split('\n').length).toBe(2)

    // The chart of the last 24 hours has the model.
    await w.page.getByRole('link', { name: 'Overview' }).click()
    await w.page.getByLabel('Range').selectOption('24h')
    await w.page.getByTestId('chart-models').getByText('test/chat').waitFor()
    // The legend is written with the page; the chart's canvas when uPlot draws it, a moment later.
    await w.page.locator('.chart canvas').waitFor()
    expect(await w.page.locator('.chart canvas').count()).toBe(1)

    await w.page.getByRole('link', { name: 'Keys' }).click()
    await w.page.getByRole('button', { name: 'Revoke console-key' }).click()
    await w.page.getByRole('alertdialog').getByText('cannot be undone').waitFor()
    await w.page.getByRole('button', { name: 'Yes, revoke' }).click()
    await w.page.locator('tr[data-key="console-key"] .status.revoked').waitFor()
    const refused = await client.chat.completions
      .create({ model: 'test/chat', messages: [{ role: 'user', content: 'again' }] })
      .catch((e: unknown) => e)
    expect(refused).toBeInstanceOf(OpenAI.AuthenticationError)
    expect((refused as InstanceType<typeof OpenAI.AuthenticationError>).status).toBe(401)

    // A write without the session's CSRF token is refused, even from the console's own page.
    const noCsrf = await w.page.evaluate(async () => {
      const r = await fetch('/console/api/v1/keys', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ name: 'forged' }),
      })
      return r.status
    })
    expect(noCsrf).toBe(403)
    expect(w.problems.filter((p) => !p.includes('HTTP 403: POST') && !p.includes('status of 403'))).toEqual(
      [],
    )

    // Sign out: the session is gone, and the page is the sign-in form again.
    await w.page.getByRole('button', { name: 'Sign out' }).click()
    await w.page.getByLabel(/master key or admin token/i).waitFor()
    expect(await ctx.cookies()).toEqual([])
    await ctx.close()
  })

  test('an operator credits the organization and its Overview shows the new balance', async () => {
    // A webhook, so its page has a row (it is never sent anything: no batch fails here).
    await t.fetch('/v1/webhooks', {
      method: 'POST',
      key: t.masterKey,
      body: JSON.stringify({
        url: 'https://hooks.example.com/pages',
        events: ['batch.failed'],
        balance_threshold_rub: 1,
      }),
    })
    const orgCtx = await newContext()
    const org = await open(orgCtx)
    await signIn(org, t.masterKey)
    const balanceCard = org.page.getByTestId('card-balance').locator('dd')
    await balanceCard.filter({ hasText: /\d/ }).waitFor()

    const opCtx = await newContext()
    const op = await open(opCtx)
    await signIn(op, ADMIN_TOKEN)
    await op.page.getByRole('heading', { level: 1, name: 'Organizations' }).waitFor()
    await op.page.getByLabel('Amount to credit to test-org, ₽').fill('250,5')
    await op.page.getByRole('button', { name: 'Credit test-org' }).click()
    await op.page.getByRole('status').getByText('Credited').waitFor()
    // A debit with a reason: the ledger keeps the reason beside the row.
    await op.page.getByLabel('Amount to credit to test-org, ₽').fill('0,5')
    await op.page
      .getByLabel('Reason for crediting or debiting test-org (a debit needs one)')
      .fill('console correction')
    await op.page.getByRole('button', { name: 'Debit test-org' }).click()
    await op.page.getByRole('status').getByText('Debited').waitFor()
    const credits = (await (
      await t.fetch('/v1/activity?include_credits=true&limit=5', { key: t.masterKey })
    ).json()) as { data: { kind: string; cost_rub: number; reason: string | null }[] }
    expect(credits.data.filter((r) => r.kind === 'credit').map((r) => [r.cost_rub, r.reason])).toContainEqual(
      [-0.5, 'console correction'],
    )

    const now = (await (await t.fetch('/v1/organization', { key: t.masterKey })).json()) as {
      balance_rub: number
    }
    await org.page.reload()
    const expected = await org.page.evaluate(
      (n) =>
        new Intl.NumberFormat('en-US', {
          style: 'currency',
          currency: 'RUB',
          currencyDisplay: 'narrowSymbol',
          minimumFractionDigits: 2,
        }).format(n),
      now.balance_rub,
    )
    await org.page.getByTestId('card-balance').getByText(expected).waitFor()
    // In Russian, money reads as Russians write it: 1 250,50 ₽ (spaces between thousands).
    await org.page.getByRole('button', { name: 'Русский' }).click()
    await org.page.getByRole('heading', { level: 1, name: 'Обзор' }).waitFor()
    // The page reloads its figures in the new language: wait for them, then read them.
    await balanceCard.filter({ hasText: /\d/ }).waitFor()
    expect(await balanceCard.textContent()).toMatch(
      /^\d{1,3}([\s\u00a0\u202f]\d{3})*,\d{2}[\s\u00a0\u202f]₽$/,
    )
    expect(org.problems).toEqual([])
    expect(op.problems).toEqual([])
    await orgCtx.close()
    await opCtx.close()
  })

  test("an operator issues an organization's master key (shown once) and revokes it", async () => {
    const ctx = await newContext()
    const w = await open(ctx)
    await signIn(w, ADMIN_TOKEN)
    await w.page.getByRole('button', { name: 'Master keys: test-org' }).click()
    const panel = w.page.getByRole('region', { name: 'Master keys of test-org' })
    await panel.getByLabel('Name').fill('deputy')
    await panel.getByRole('button', { name: 'Issue a master key' }).click()
    const secret = (await panel.getByTestId('secret').textContent())!
    expect(secret).toMatch(/^mk-[0-9A-Za-z]{43}$/)
    const signInWith = (token: string) =>
      fetch(`${t.url}/console/session`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ token }),
      })
    expect((await signInWith(secret)).status).toBe(201)
    await panel.getByRole('button', { name: 'Done' }).click()
    await panel.getByRole('button', { name: 'Revoke deputy' }).click()
    await panel.getByRole('button', { name: 'Yes, revoke' }).click()
    await panel.locator('tr[data-master="deputy"] .status.revoked').waitFor()
    expect((await signInWith(secret)).status).toBe(401)
    expect(w.problems).toEqual([])
    await ctx.close()
  })

  test('an organization adds a webhook (its secret shown once), sees its deliveries, disables and deletes it', async () => {
    const ctx = await newContext()
    const w = await open(ctx)
    await signIn(w, t.masterKey)
    await w.page.goto(`${t.url}/console#/webhooks`)
    const form = w.page.getByRole('form', { name: 'Add a webhook' })
    await form.getByLabel('URL').fill('https://hooks.example.com/console-test')
    await form.getByLabel('batch.failed').check()
    await form.getByLabel('batch.expired').check()
    await form.getByRole('button', { name: 'Add a webhook' }).click()
    const secret = (await w.page.getByTestId('secret').textContent())!
    expect(secret).toMatch(/^whsec_[0-9A-Za-z]{32}$/)
    await w.page.getByRole('button', { name: 'Done' }).click()
    const row = w.page.locator('tr[data-webhook="https://hooks.example.com/console-test"]')
    await row.locator('.status.active').waitFor()
    const listed = (await (await t.fetch('/v1/webhooks', { key: t.masterKey })).json()) as {
      data: { id: string; url: string; events: string[]; enabled: boolean }[]
    }
    const made = listed.data.find((h) => h.url === 'https://hooks.example.com/console-test')!
    expect(made.events).toEqual(['batch.failed', 'batch.expired'])
    await w.page.getByRole('button', { name: 'Deliveries https://hooks.example.com/console-test' }).click()
    await w.page.getByText('No events yet.').waitFor()
    await w.page.getByRole('button', { name: 'Disable https://hooks.example.com/console-test' }).click()
    await row.locator('.status.disabled').waitFor()
    expect(
      (
        (await (await t.fetch(`/v1/webhooks/${made.id}`, { key: t.masterKey })).json()) as {
          enabled: boolean
        }
      ).enabled,
    ).toBe(false)
    await w.page.getByRole('button', { name: 'Delete https://hooks.example.com/console-test' }).click()
    await w.page.getByRole('button', { name: 'Yes, delete' }).click()
    await row.waitFor({ state: 'detached' })
    expect((await t.fetch(`/v1/webhooks/${made.id}`, { key: t.masterKey })).status).toBe(404)
    expect(w.problems).toEqual([])
    await ctx.close()
  })

  test('the Fleet page updates by itself: a request shows up without a reload', async () => {
    const ctx = await newContext()
    const w = await open(ctx)
    await signIn(w, ADMIN_TOKEN)
    await w.page.getByRole('link', { name: 'Fleet' }).click()
    await w.page.locator('tr[data-node]').first().waitFor()
    expect(await w.page.locator('tr[data-node]').count()).toBe(3)
    const total = async () => {
      const data = (await (await t.admin('/v1/admin/fleet')).json()) as { data: { requests: number }[] }
      return data.data.reduce((a, n) => a + n.requests, 0)
    }
    const shown = () =>
      w.page.evaluate<number>(`[...document.querySelectorAll('tr[data-node] td:last-child')]
        .map((td) => Number((td.textContent ?? '').split('/')[0].replace(/\\D/g, '')))
        .reduce((a, b) => a + b, 0)`)
    const before = await total()
    await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages: [{ role: 'user', content: 'hi' }] })
    expect(await total()).toBe(before + 1)
    const deadline = Date.now() + 10_000
    while ((await shown()) !== before + 1 && Date.now() < deadline) await Bun.sleep(200)
    expect(await shown()).toBe(before + 1)
    expect(w.problems).toEqual([])
    await ctx.close()
  })

  test('the Playground streams an answer with a chosen key and shows its cost and node', async () => {
    const ctx = await newContext()
    const w = await open(ctx)
    await signIn(w, t.masterKey)
    await w.page.getByRole('link', { name: 'Playground' }).click()
    await w.page.getByLabel('API key to use').selectOption({ label: 'test' })
    await w.page.getByLabel('Model').selectOption('test/chat')
    await w.page.getByLabel('Message').fill('Tell me about routers')
    const before = (await (await t.fetch('/v1/activity?limit=1000', { key: t.masterKey })).json()) as {
      data: unknown[]
    }
    await w.page.getByRole('button', { name: 'Send' }).click()
    await w.page.getByTestId('cost').getByText('₽').waitFor()
    expect((await w.page.getByTestId('answer').textContent())!.length).toBeGreaterThan(0)
    expect(await w.page.getByTestId('node').textContent()).toMatch(/^sim-\d$/)
    // Billed to the chosen key, at the cost shown.
    const after = (await (await t.fetch('/v1/activity?limit=1000', { key: t.masterKey })).json()) as {
      data: { key_name: string; cost_rub: number; node: string }[]
    }
    expect(after.data.length).toBe(before.data.length + 1)
    const row = after.data[0]!
    expect(row.key_name).toBe('test')
    expect(await w.page.getByTestId('node').textContent()).toBe(row.node)
    const shown = await w.page.getByTestId('cost').textContent()
    expect(shown).toBe(
      new Intl.NumberFormat('en-US', {
        style: 'currency',
        currency: 'RUB',
        currencyDisplay: 'narrowSymbol',
        minimumFractionDigits: 2,
        maximumFractionDigits: 6,
      }).format(row.cost_rub),
    )
    expect(w.problems).toEqual([])
    await ctx.close()
  })

  test('the CSP blocks inline script on the console page', async () => {
    const ctx = await newContext()
    const page = await ctx.newPage()
    const response = await page.goto(`${t.url}/console`)
    const csp = response!.headers()['content-security-policy'] ?? ''
    expect(csp).toContain("script-src 'self'")
    expect(csp).not.toContain('unsafe-inline')
    const ran = await page.evaluate(`(async () => {
      const s = document.createElement('script')
      s.textContent = 'window.__inline = true'
      document.body.append(s)
      await new Promise((r) => setTimeout(r, 50))
      return window.__inline === true
    })()`)
    expect(ran).toBe(false)
    await ctx.close()
  })

  test('every page, in English and Russian: no serious or critical axe-core violation, no errors, phone width', async () => {
    // Something to show in Activity, the chart and the Fleet's TTFT, whichever tests ran before.
    for (let i = 0; i < 3; i++) {
      const stream = await t.client().chat.completions.create({
        model: 'test/chat',
        messages: [{ role: 'user', content: `hello ${i}` }],
        stream: true,
      })
      for await (const _ of stream) {
        // drain
      }
    }
    const orgCtx = await newContext()
    const org = await open(orgCtx)
    await signIn(org, t.masterKey)
    const opCtx = await newContext()
    const op = await open(opCtx)
    await signIn(op, ADMIN_TOKEN)
    for (const lang of ['en', 'ru'] as const) {
      await visit(org, 'overview', lang, '.chart canvas')
      await visit(org, 'keys', lang, 'tr[data-key]')
      await visit(org, 'activity', lang, 'tbody tr')
      await visit(org, 'models', lang, 'tbody tr')
      await visit(org, 'batches', lang, 'form')
      await visit(org, 'webhooks', lang, 'tr[data-webhook]')
      await visit(org, 'playground', lang, 'textarea')
      await visit(op, 'orgs', lang, 'tr[data-org]')
      await visit(op, 'models', lang, 'tbody tr td:nth-child(6):not(:empty)', 0, 'models-operator')
      // A few polls, so the sparklines have a line to draw.
      await visit(op, 'fleet', lang, 'tr[data-node] canvas', 4500)
    }
    expect(org.problems).toEqual([])
    expect(op.problems).toEqual([])
    await orgCtx.close()
    await opCtx.close()
    // Twenty pages with an accessibility audit each: 35 s alone on a loaded 2-core machine.
  }, 120_000)
})
