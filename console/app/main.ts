import 'uplot/dist/uPlot.min.css'
import './style.css'
import { html } from 'htm/preact'
import { render } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import { ApiError, type Session, session, useSession } from './api.ts'
import { type Key, lang, setLang, t } from './i18n.ts'
import { Activity } from './pages/activity.ts'
import { Batches } from './pages/batches.ts'
import { Fleet } from './pages/fleet.ts'
import { Keys } from './pages/keys.ts'
import { Models } from './pages/models.ts'
import { Orgs } from './pages/orgs.ts'
import { Overview } from './pages/overview.ts'
import { Playground } from './pages/playground.ts'
import { Webhooks } from './pages/webhooks.ts'

interface Page {
  readonly id: string
  readonly title: Key
  readonly view: (p: { session: Session }) => unknown
}
const ORG_PAGES: Page[] = [
  { id: 'overview', title: 'nav.overview', view: Overview },
  { id: 'keys', title: 'nav.keys', view: Keys },
  { id: 'activity', title: 'nav.activity', view: Activity },
  { id: 'models', title: 'nav.models', view: Models },
  { id: 'batches', title: 'nav.batches', view: Batches },
  { id: 'webhooks', title: 'nav.webhooks', view: Webhooks },
  { id: 'playground', title: 'nav.playground', view: Playground },
]
const OPERATOR_PAGES: Page[] = [
  { id: 'orgs', title: 'nav.orgs', view: Orgs },
  { id: 'fleet', title: 'nav.fleet', view: Fleet },
  { id: 'models', title: 'nav.models', view: Models },
]

const route = () => location.hash.replace(/^#\/?/, '')

function SignIn({ onIn }: { onIn: (s: Session) => void }) {
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)
  const submit = async (e: Event) => {
    e.preventDefault()
    const form = e.currentTarget as HTMLFormElement
    const input = form.elements.namedItem('token') as HTMLInputElement
    setBusy(true)
    try {
      const s = await session.signIn(input.value.trim())
      input.value = ''
      onIn(s)
    } catch (err) {
      setError(err instanceof ApiError && err.status === 403 ? t('signin.apiKey') : t('signin.bad'))
    } finally {
      setBusy(false)
    }
  }
  return html`<main class="signin">
    <h1>${t('app.title')}</h1>
    <form onSubmit=${submit}>
      <h2>${t('signin.title')}</h2>
      <label for="token">${t('signin.token')}</label>
      <input id="token" name="token" type="password" autocomplete="off" required />
      <p class="muted">${t('signin.hint')}</p>
      ${error && html`<p class="error" role="alert">${error}</p>`}
      <button type="submit" disabled=${busy}>${t('signin.submit')}</button>
    </form>
    <${LangSwitch} />
  </main>`
}

function LangSwitch() {
  const next = lang.value === 'ru' ? 'en' : 'ru'
  return html`<button type="button" class="lang secondary" lang=${next} title=${t('lang.switchLabel')}
    onClick=${() => setLang(next)}>${t('lang.switch')}</button>`
}

function Shell({ s, onOut }: { s: Session; onOut: () => void }) {
  const pages = s.role === 'operator' ? OPERATOR_PAGES : ORG_PAGES
  const [id, setId] = useState(route())
  useEffect(() => {
    const on = () => setId(route())
    addEventListener('hashchange', on)
    return () => removeEventListener('hashchange', on)
  }, [])
  const page = pages.find((p) => p.id === id) ?? pages[0]!
  useEffect(() => {
    document.title = `${t(page.title)} · ${t('app.title')}`
  })
  const out = async () => {
    await session.signOut().catch(() => {})
    onOut()
  }
  return html`<div class="shell">
    <header>
      <div class="brand">Tropa <span class="muted">${s.role === 'operator' ? t('role.operator') : s.organization?.name}</span></div>
      <nav aria-label=${t('nav.main')}>
        ${pages.map(
          (p) =>
            html`<a href=${`#/${p.id}`} aria-current=${p === page ? 'page' : undefined}>${t(p.title)}</a>`,
        )}
      </nav>
      <div class="row">
        <${LangSwitch} />
        <button type="button" class="secondary" onClick=${out}>${t('signout')}</button>
      </div>
    </header>
    <main>
      <h1>${t(page.title)}</h1>
      <${page.view} key=${page.id} session=${s} />
    </main>
  </div>`
}

function App() {
  const [s, setS] = useState<Session | null | undefined>(undefined)
  const [, setLangTick] = useState(lang.value)
  useEffect(() => {
    session.current().then(setS, () => setS(null))
    const on = () => setLangTick(lang.value)
    addEventListener('tropa-lang', on)
    return () => removeEventListener('tropa-lang', on)
  }, [])
  useSession(s ?? null, () => setS(null))
  if (s === undefined) return html`<p class="muted">${t('common.loading')}</p>`
  if (s === null) return html`<${SignIn} onIn=${setS} />`
  return html`<${Shell} key=${lang.value} s=${s} onOut=${() => setS(null)} />`
}

document.documentElement.lang = lang.value
render(html`<${App} />`, document.getElementById('app')!)
