import { html } from 'htm/preact'
import { useState } from 'preact/hooks'
import { api, qs } from '../api.ts'
import { num, rub, t, when } from '../i18n.ts'
import { ErrorBox, Scroll, useLoad } from '../ui.ts'

interface Row {
  request_id: string
  created_at: number
  key_id: string | null
  key_name: string | null
  model: string | null
  node: string | null
  outcome: string
  prompt_tokens: number
  completion_tokens: number
  cached_tokens: number | null
  cost_rub: number
  duration_ms: number
  ttft_ms: number | null
}
interface Page {
  data: Row[]
  has_more: boolean
  last_id: string | null
}
interface Filters {
  key_id?: string
  model?: string
  outcome?: string
  from?: number
  to?: number
}

const OUTCOMES = [
  'ok',
  'ok:estimated',
  'client_disconnected',
  'client_stalled',
  'upstream_broken',
  'upstream_error',
  'upstream_timeout',
]
const PAGE = 50

/** A datetime-local value (the browser's zone) as Unix seconds. */
const secOf = (v: string) => (v ? Math.floor(new Date(v).getTime() / 1000) : undefined)

export function Activity() {
  const [filters, setFilters] = useState<Filters>({})
  // The cursors of the pages before this one (for "back to the first page").
  const [after, setAfter] = useState<string | undefined>(undefined)
  const keys = useLoad(() => api<{ data: { key_id: string; name: string }[] }>('/keys?limit=1000'))
  const models = useLoad(() => api<{ data: { id: string }[] }>('/models'))
  const page = useLoad(
    () => api<Page>(`/activity${qs({ ...filters, after, limit: PAGE })}`),
    [filters, after],
  )
  const apply = (e: Event) => {
    e.preventDefault()
    const f = e.currentTarget as HTMLFormElement
    const v = (n: string) => (f.elements.namedItem(n) as HTMLInputElement).value || undefined
    setAfter(undefined)
    setFilters({
      key_id: v('key_id'),
      model: v('model'),
      outcome: v('outcome'),
      from: secOf(v('from') ?? ''),
      to: secOf(v('to') ?? ''),
    })
  }
  const csv = `/console/api/v1/activity${qs({ ...filters, format: 'csv' })}`
  return html`<div>
    <form class="inline filters" onSubmit=${apply} aria-label=${t('activity.filters')}>
      <label>${t('activity.key')}
        <select name="key_id"><option value="">${t('activity.any')}</option>
          ${(keys.data?.data ?? []).map((k) => html`<option value=${k.key_id}>${k.name}</option>`)}
        </select>
      </label>
      <label>${t('activity.model')}
        <select name="model"><option value="">${t('activity.any')}</option>
          ${(models.data?.data ?? []).map((m) => html`<option value=${m.id}>${m.id}</option>`)}
        </select>
      </label>
      <label>${t('activity.outcome')}
        <select name="outcome"><option value="">${t('activity.any')}</option>
          ${OUTCOMES.map((o) => html`<option value=${o}>${o}</option>`)}
        </select>
      </label>
      <label>${t('activity.from')} <input type="datetime-local" name="from" /></label>
      <label>${t('activity.to')} <input type="datetime-local" name="to" /></label>
      <button type="submit">${t('activity.apply')}</button>
      <a class="button secondary" href=${csv} download>${t('activity.csv')}</a>
    </form>
    <${ErrorBox} error=${page.error} />
    <${Scroll} label=${t('nav.activity')}>
      <table>
        <thead><tr>
          <th scope="col">${t('activity.time')}</th>
          <th scope="col">${t('activity.key')}</th>
          <th scope="col">${t('activity.model')}</th>
          <th scope="col">${t('activity.node')}</th>
          <th scope="col" class="num">${t('activity.tokens')}</th>
          <th scope="col" class="num">${t('activity.cost')}</th>
          <th scope="col">${t('activity.outcome')}</th>
          <th scope="col" class="num">${t('activity.duration')}</th>
        </tr></thead>
        <tbody>
          ${(page.data?.data ?? []).map(
            (r) => html`<tr data-request=${r.request_id}>
              <td>${when(r.created_at)}</td>
              <td>${r.key_name ?? r.key_id ?? t('common.none')}</td>
              <td><code>${r.model ?? t('common.none')}</code></td>
              <td>${r.node ?? t('common.none')}</td>
              <td class="num">${num(r.prompt_tokens)} / ${num(r.completion_tokens)} / ${num(r.cached_tokens)}</td>
              <td class="num">${rub(r.cost_rub)}</td>
              <td>${r.outcome}</td>
              <td class="num">${num(r.duration_ms)} / ${num(r.ttft_ms)}</td>
            </tr>`,
          )}
        </tbody>
      </table>
    <//>
    ${page.data && page.data.data.length === 0 && html`<p class="muted">${t('activity.empty')}</p>`}
    <div class="row">
      ${after !== undefined && html`<button type="button" class="secondary" onClick=${() => setAfter(undefined)}>${t('common.first')}</button>`}
      ${page.data?.has_more && html`<button type="button" class="secondary" onClick=${() => setAfter(page.data!.last_id ?? undefined)}>${t('common.next')}</button>`}
    </div>
  </div>`
}
