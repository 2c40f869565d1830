import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { existsSync } from 'node:fs'
import { chromium } from 'playwright-core'
import { startTropa, type Tropa } from '../helpers/start.ts'

// /docs serves its viewer (Swagger UI, embedded) from Tropa itself: it renders in a browser that
// can reach nothing but the server, under a Content-Security-Policy without inline script.
const CHROMIUM = '/usr/bin/chromium'
const haveChromium = existsSync(CHROMIUM)
if (!haveChromium)
  console.warn(
    `SKIPPED /docs in a browser: no ${CHROMIUM} here (apt-get install -y chromium; .ci/run installs it)`,
  )

let t: Tropa
beforeAll(async () => {
  t = await startTropa()
})
afterAll(() => t.stop())

describe('/docs over HTTP', () => {
  test('the page has a strict CSP and loads only its own hashed assets', async () => {
    const r = await fetch(`${t.url}/docs`)
    expect(r.status).toBe(200)
    expect(r.headers.get('content-type')).toBe('text/html; charset=utf-8')
    const csp = r.headers.get('content-security-policy') ?? ''
    expect(csp).toContain("default-src 'none'")
    expect(csp).toContain("script-src 'self'")
    expect(csp).not.toContain('unsafe-inline')
    expect(csp).not.toContain('unsafe-eval')
    const html = await r.text()
    // No inline script: every <script> has a src, and nothing names another origin.
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/)
    expect(html).not.toMatch(/(src|href)="(https?:)?\/\//)
    const refs = [...html.matchAll(/(?:src|href)="(\/docs\/assets\/[^"]+)"/g)].map((m) => m[1]!)
    expect(refs.length).toBe(3)
    for (const ref of refs) {
      expect(ref).toMatch(/^\/docs\/assets\/[\w-]+\.[0-9a-f]{16}\.(js|css)$/)
      const a = await fetch(`${t.url}${ref}`)
      expect(a.status).toBe(200)
      expect(a.headers.get('content-type')).toStartWith(ref.endsWith('.css') ? 'text/css' : 'text/javascript')
      expect(a.headers.get('cache-control')).toContain('immutable')
      expect((await a.arrayBuffer()).byteLength).toBeGreaterThan(100)
    }
  })

  test('an unknown asset is a 404 in the OpenAI error shape', async () => {
    const r = await fetch(`${t.url}/docs/assets/swagger-ui-bundle.0000000000000000.js`)
    expect(r.status).toBe(404)
    expect(((await r.json()) as { error: { code: string } }).error.code).toBe('unknown_path')
  })

  test('/docs/json is still the OpenAPI document of the routes', async () => {
    const r = await fetch(`${t.url}/docs/json`)
    expect(r.status).toBe(200)
    const doc = (await r.json()) as {
      openapi: string
      info: { title: string }
      paths: Record<string, unknown>
    }
    expect(doc.openapi).toBe('3.0.3')
    expect(doc.info.title).toBe('Tropa')
    expect(Object.keys(doc.paths)).toContain('/v1/chat/completions')
    expect(Object.keys(doc.paths).some((p) => p.startsWith('/docs'))).toBe(false)
  })
})

describe.skipIf(!haveChromium)('/docs in headless Chromium with the network blocked', () => {
  test('the viewer renders the operations, offline, with no CSP violation or page error', async () => {
    const origin = new URL(t.url).origin
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] })
    try {
      const context = await browser.newContext({ serviceWorkers: 'block' })
      const blocked: string[] = []
      const offsite: string[] = []
      await context.route('**/*', (route) => {
        const url = route.request().url()
        if (new URL(url).origin === origin) return route.continue()
        blocked.push(url)
        return route.abort('blockedbyclient')
      })
      const page = await context.newPage()
      const violations: string[] = []
      const errors: string[] = []
      page.on('request', (req) => {
        const url = new URL(req.url())
        if (url.protocol !== 'data:' && url.origin !== origin) offsite.push(req.url())
      })
      page.on('pageerror', (err) => errors.push(err.message))
      page.on('console', (msg) => {
        if (msg.text().includes('Content Security Policy')) violations.push(msg.text())
      })
      await page.exposeFunction('__cspViolation', (v: string) => violations.push(v))
      // Runs in the page (injected by the browser, outside the page's CSP).
      await page.addInitScript({
        content: `document.addEventListener('securitypolicyviolation', (e) =>
          window.__cspViolation(e.violatedDirective + ' ' + e.blockedURI))`,
      })
      const res = await page.goto(`${t.url}/docs`)
      expect(res?.status()).toBe(200)
      await page.getByText('/v1/chat/completions', { exact: true }).first().waitFor({ timeout: 30_000 })
      // biome-ignore lint/performance/useDomNodeTextContent: the rendered text is what an operator sees
      const text = await page.locator('body').innerText()
      expect(text).toContain('Chat completion')
      expect(text).toContain('/v1/embeddings')
      expect(text).toContain('Tropa')
      expect(blocked).toEqual([])
      expect(offsite).toEqual([])
      expect(violations).toEqual([])
      expect(errors).toEqual([])
    } finally {
      await browser.close()
    }
  }, 60_000)
})
