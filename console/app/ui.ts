import { html } from 'htm/preact'
import type { ComponentChildren } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import { ApiError } from './api.ts'
import { t } from './i18n.ts'

/** Loads once per change of `deps`; `reload` runs it again. */
export function useLoad<T>(load: () => Promise<T>, deps: unknown[] = []) {
  const [data, setData] = useState<T | undefined>(undefined)
  const [error, setError] = useState<string | null>(null)
  const [n, setN] = useState(0)
  useEffect(() => {
    let live = true
    load().then(
      (d) => {
        if (live) {
          setData(d)
          setError(null)
        }
      },
      (e: unknown) => live && setError(messageOf(e)),
    )
    return () => {
      live = false
    }
  }, [...deps, n])
  return { data, error, reload: () => setN((x) => x + 1) }
}

/**
 * An action a page runs (create, revoke, cancel): `run` clears the last error, runs it, then
 * `then` (a reload) when it succeeded, or shows its error.
 */
export function useAction(then: () => void) {
  const [error, setError] = useState<string | null>(null)
  const run = async (f: () => Promise<unknown>) => {
    setError(null)
    try {
      await f()
      then()
    } catch (e) {
      setError(messageOf(e))
    }
  }
  return { error, setError, run }
}

export const messageOf = (e: unknown) => (e instanceof ApiError || e instanceof Error ? e.message : String(e))

export const ErrorBox = ({ error }: { error: string | null }) =>
  error ? html`<p class="error" role="alert">${t('common.error')}: ${error}</p>` : null

/** A table that scrolls sideways on a narrow screen (focusable, so keyboards can scroll it too). */
export const Scroll = ({ label, children }: { label: string; children: ComponentChildren }) =>
  html`<div class="scroll" tabindex="0" role="region" aria-label=${label}>${children}</div>`

/** Spent against a limit, as a bar; no limit: the amount alone. */
export const Bar = ({ value, max, label }: { value: number; max: number; label: string }) => {
  const share = max > 0 ? Math.min(1, value / max) : 0
  return html`<div class="bar" role="progressbar" aria-label=${label} aria-valuemin="0" aria-valuemax="100" aria-valuenow=${Math.round(share * 100)}>
    <div class=${share >= 0.9 ? 'fill hot' : 'fill'} style=${{ width: `${share * 100}%` }}></div>
  </div>`
}

/** A secret shown once, with a copy button. */
export const Secret = ({ title, secret, onDone }: { title: string; secret: string; onDone: () => void }) => {
  const [copied, setCopied] = useState(false)
  return html`<section class="secret" aria-label=${title}>
    <h2>${title}</h2>
    <p>${t('keys.secretOnce')}</p>
    <code data-testid="secret">${secret}</code>
    <div class="row">
      <button type="button" onClick=${() => navigator.clipboard.writeText(secret).then(() => setCopied(true))}>
        ${copied ? t('common.copied') : t('common.copy')}
      </button>
      <button type="button" class="secondary" onClick=${onDone}>${t('keys.done')}</button>
    </div>
  </section>`
}
