import { existsSync } from 'node:fs'
import { type Browser, type BrowserContext, chromium, type Page } from 'playwright-core'

/** Debian's Chromium (`apt-get install -y chromium`; .ci/run installs it). */
export const CHROMIUM = '/usr/bin/chromium'
export const haveChromium = existsSync(CHROMIUM)

/**
 * Headless Chromium that reaches nothing but what a test opens: no first-run, sync, component
 * updates or background requests to Google's hosts. launch() gives it a fresh temporary profile.
 */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  })
}

/** A page and what went wrong on it: console errors and warnings, failed or refused requests, requests elsewhere. */
export interface Watched {
  page: Page
  problems: string[]
  /** The test is leaving the page: requests it cuts short (a poll) are not failures. */
  leaving: boolean
}

export async function watchedPage(ctx: BrowserContext, origin: string): Promise<Watched> {
  const page = await ctx.newPage()
  const problems: string[] = []
  const w: Watched = { page, problems, leaving: false }
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`)
  })
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`))
  page.on('requestfailed', (r) => {
    if (!(w.leaving && r.failure()?.errorText === 'net::ERR_ABORTED'))
      problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`)
  })
  page.on('response', (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.request().method()} ${r.url()}`)
  })
  page.on('request', (r) => {
    if (!r.url().startsWith(origin) && !r.url().startsWith('data:')) problems.push(`other origin: ${r.url()}`)
  })
  return w
}

/** Signs in on the console's form and waits for its navigation. */
export async function consoleSignIn(w: Watched, origin: string, token: string): Promise<void> {
  await w.page.goto(`${origin}/`)
  await w.page.getByLabel(/master key or admin token|мастер-ключ или токен/i).fill(token)
  await w.page.locator('form button[type=submit]').click()
  await w.page.locator('header nav').waitFor()
}
