import { html } from 'htm/preact'
import { useEffect, useState } from 'preact/hooks'
import { apiAsKey } from '../api.ts'
import { num, rub, t, when } from '../i18n.ts'
import { useKeyPick } from '../keypick.ts'
import { Bar, ErrorBox, messageOf, Scroll, useAction } from '../ui.ts'

interface Batch {
  id: string
  status: string
  endpoint: string
  created_at: number
  request_counts: { total: number; completed: number; failed: number }
  cost_rub: number
  output_file_url: string | null
  error_file_url: string | null
}

const FINAL = new Set(['completed', 'failed', 'expired', 'cancelled'])
const CANCELLABLE = new Set(['validating', 'in_progress'])

/** A signed link as a path of this origin (it works without credentials, whatever host it names). */
const here = (url: string) => {
  const u = new URL(url)
  return u.pathname + u.search
}

export function Batches() {
  const { keyId, picker, none } = useKeyPick()
  const [batches, setBatches] = useState<Batch[] | null>(null)
  const [tick, setTick] = useState(0)
  const { error, setError, run } = useAction(() => setTick((x) => x + 1))
  useEffect(() => {
    if (!keyId) return
    let live = true
    let timer: ReturnType<typeof setTimeout> | undefined
    const load = async () => {
      try {
        const r = await apiAsKey<{ data: Batch[] }>(keyId, '/batches?limit=100')
        if (!live) return
        setBatches(r.data)
        // Running batches are followed every 2 s; finished ones need no polling.
        if (r.data.some((b) => !FINAL.has(b.status))) timer = setTimeout(load, 2000)
      } catch (e) {
        if (live) setError(messageOf(e))
      }
    }
    void load()
    return () => {
      live = false
      clearTimeout(timer)
    }
  }, [keyId, tick])
  const create = (e: Event) => {
    e.preventDefault()
    if (!keyId) return
    const form = e.currentTarget as HTMLFormElement
    const data = new FormData(form)
    data.delete('key')
    data.set('completion_window', '24h')
    return run(async () => {
      await apiAsKey(keyId, '/batches', 'POST', undefined, data)
      form.reset()
    })
  }
  return html`<div>
    ${none}
    <form class="inline" onSubmit=${create} aria-label=${t('batches.create')}>
      ${picker}
      <label>${t('batches.file')} <input type="file" name="file" accept=".jsonl,application/jsonl" required /></label>
      <label>${t('batches.endpoint')}
        <select name="endpoint">
          <option value="/v1/chat/completions">/v1/chat/completions</option>
          <option value="/v1/embeddings">/v1/embeddings</option>
        </select>
      </label>
      <button type="submit" disabled=${!keyId}>${t('batches.create')}</button>
    </form>
    <${ErrorBox} error=${error} />
    <${Scroll} label=${t('nav.batches')}>
      <table>
        <thead><tr>
          <th scope="col">${t('batches.id')}</th>
          <th scope="col">${t('common.created')}</th>
          <th scope="col">${t('common.status')}</th>
          <th scope="col">${t('batches.progress')}</th>
          <th scope="col" class="num">${t('batches.counts')}</th>
          <th scope="col" class="num">${t('batches.cost')}</th>
          <th scope="col">${t('common.actions')}</th>
        </tr></thead>
        <tbody>
          ${(batches ?? []).map((b) => {
            const c = b.request_counts
            return html`<tr data-batch=${b.id} data-status=${b.status}>
              <td><code>${b.id}</code><br /><span class="muted">${b.endpoint}</span></td>
              <td>${when(b.created_at)}</td>
              <td><span class="status">${b.status}</span></td>
              <td><${Bar} value=${c.completed + c.failed} max=${c.total} label=${`${t('batches.progress')}: ${b.id}`} /></td>
              <td class="num" data-testid="counts">${num(c.completed)} / ${num(c.failed)} / ${num(c.total)}</td>
              <td class="num">${rub(b.cost_rub)}</td>
              <td class="actions">
                ${CANCELLABLE.has(b.status) && html`<button type="button" class="secondary" aria-label=${`${t('batches.cancel')} ${b.id}`} onClick=${() => run(() => apiAsKey(keyId!, `/batches/${b.id}/cancel`, 'POST'))}>${t('batches.cancel')}</button>`}
                ${b.output_file_url && html`<a class="button secondary" href=${here(b.output_file_url)} download>${t('batches.output')}</a>`}
                ${b.error_file_url && html`<a class="button secondary" href=${here(b.error_file_url)} download>${t('batches.errors')}</a>`}
              </td>
            </tr>`
          })}
        </tbody>
      </table>
    <//>
    ${batches && batches.length === 0 && html`<p class="muted">${t('batches.empty')}</p>`}
  </div>`
}
