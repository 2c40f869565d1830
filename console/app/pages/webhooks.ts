import { html } from 'htm/preact'
import { useState } from 'preact/hooks'
import { WEBHOOK_EVENT_TYPES } from '../../../src/webhooks/event-types.ts'
import { api } from '../api.ts'
import { rub, t, when } from '../i18n.ts'
import { ErrorBox, Scroll, Secret, useAction, useLoad } from '../ui.ts'

interface Webhook {
  id: string
  url: string
  events: string[]
  balance_threshold_rub: number | null
  enabled: boolean
  created_at: number
}

interface Delivery {
  id: string
  type: string
  status: 'pending' | 'delivered' | 'failed'
  attempts: number
  created_at: number
  last_status: number | null
  last_error: string | null
}

/** The events a webhook may receive (docs/webhooks.md). */
const EVENTS = WEBHOOK_EVENT_TYPES

const amountOf = (v: string): number | null => (v.trim() === '' ? null : Number(v.trim().replace(',', '.')))

export function Webhooks() {
  const list = useLoad(() => api<{ data: Webhook[] }>('/webhooks'))
  const [secret, setSecret] = useState<string | null>(null)
  const [shown, setShown] = useState<string | null>(null)
  const { error, run: act } = useAction(list.reload)
  const create = (e: Event) => {
    e.preventDefault()
    const form = e.currentTarget as HTMLFormElement
    const data = new FormData(form)
    const body = {
      url: String(data.get('url') ?? '').trim(),
      events: data.getAll('events').map(String),
      balance_threshold_rub: amountOf(String(data.get('threshold') ?? '')),
    }
    return act(async () => {
      const w = await api<{ secret: string }>('/webhooks', 'POST', body)
      form.reset()
      setSecret(w.secret)
    })
  }
  const hooks = list.data?.data ?? []
  return html`<div>
    <${ErrorBox} error=${error ?? list.error} />
    ${secret && html`<${Secret} title=${t('hooks.secretTitle')} secret=${secret} onDone=${() => setSecret(null)} />`}
    <form class="inline" onSubmit=${create} aria-label=${t('hooks.create')}>
      <label>${t('hooks.url')} <input name="url" type="url" required maxlength="2048" placeholder="https://" /></label>
      <fieldset class="events">
        <legend>${t('hooks.events')}</legend>
        ${EVENTS.map((e) => html`<label class="check"><input type="checkbox" name="events" value=${e} /> <code>${e}</code></label>`)}
      </fieldset>
      <label>${t('hooks.threshold')} <input name="threshold" inputmode="decimal" pattern="[0-9]+([.,][0-9]{1,6})?" /></label>
      <button type="submit">${t('hooks.create')}</button>
    </form>
    <p class="muted">${t('hooks.about')}</p>
    <${Scroll} label=${t('nav.webhooks')}>
      <table>
        <thead><tr>
          <th scope="col">${t('hooks.url')}</th>
          <th scope="col">${t('hooks.events')}</th>
          <th scope="col" class="num">${t('hooks.thresholdShort')}</th>
          <th scope="col">${t('common.status')}</th>
          <th scope="col">${t('common.actions')}</th>
        </tr></thead>
        <tbody>${hooks.map((w) => html`<${Row} key=${w.id} w=${w} act=${act} show=${() => setShown(shown === w.id ? null : w.id)} />`)}</tbody>
      </table>
    <//>
    ${list.data && hooks.length === 0 && html`<p class="muted">${t('hooks.empty')}</p>`}
    ${shown && hooks.some((w) => w.id === shown) && html`<${Deliveries} key=${shown} id=${shown} />`}
  </div>`
}

function Row({
  w,
  act,
  show,
}: {
  w: Webhook
  act: (f: () => Promise<unknown>) => Promise<void>
  show: () => void
}) {
  const [confirm, setConfirm] = useState(false)
  const patch = (body: Record<string, unknown>) => act(() => api(`/webhooks/${w.id}`, 'PATCH', body))
  return html`<tr data-webhook=${w.url}>
    <td><code>${w.url}</code></td>
    <td>${w.events.map((e) => html`<code class="tag">${e}</code> `)}</td>
    <td class="num">${rub(w.balance_threshold_rub)}</td>
    <td><span class=${`status ${w.enabled ? 'active' : 'disabled'}`}>${t(w.enabled ? 'hooks.enabled' : 'hooks.disabled')}</span></td>
    <td class="actions">
      ${
        confirm
          ? html`<div role="alertdialog" aria-label=${t('hooks.delete')} class="confirm">
              <p>${t('hooks.deleteConfirm', { url: w.url })}</p>
              <button type="button" class="danger" onClick=${() => act(() => api(`/webhooks/${w.id}`, 'DELETE'))}>${t('hooks.deleteYes')}</button>
              <button type="button" class="secondary" onClick=${() => setConfirm(false)}>${t('common.cancel')}</button>
            </div>`
          : html`<button type="button" class="secondary" aria-label=${`${t('hooks.deliveries')} ${w.url}`} onClick=${show}>${t('hooks.deliveries')}</button>
              <button type="button" class="secondary" aria-label=${`${t(w.enabled ? 'hooks.disable' : 'hooks.enable')} ${w.url}`} onClick=${() => patch({ enabled: !w.enabled })}>${t(w.enabled ? 'hooks.disable' : 'hooks.enable')}</button>
              <button type="button" class="danger" aria-label=${`${t('hooks.delete')} ${w.url}`} onClick=${() => setConfirm(true)}>${t('hooks.delete')}</button>`
      }
    </td>
  </tr>`
}

function Deliveries({ id }: { id: string }) {
  const list = useLoad(() => api<{ data: Delivery[] }>(`/webhooks/${id}/events?limit=50`))
  const rows = list.data?.data ?? []
  return html`<section aria-label=${t('hooks.deliveries')}>
    <h2>${t('hooks.deliveries')}</h2>
    <${ErrorBox} error=${list.error} />
    <button type="button" class="secondary" onClick=${list.reload}>${t('common.refresh')}</button>
    <${Scroll} label=${t('hooks.deliveries')}>
      <table>
        <thead><tr>
          <th scope="col">${t('common.created')}</th>
          <th scope="col">${t('hooks.type')}</th>
          <th scope="col">${t('common.status')}</th>
          <th scope="col" class="num">${t('hooks.attempts')}</th>
          <th scope="col">${t('hooks.lastAnswer')}</th>
        </tr></thead>
        <tbody>${rows.map(
          (d) => html`<tr data-event=${d.id}>
            <td>${when(d.created_at)}</td>
            <td><code>${d.type}</code></td>
            <td>${t(`hooks.status.${d.status}`)}</td>
            <td class="num">${d.attempts}</td>
            <td>${d.last_error ?? d.last_status ?? t('common.none')}</td>
          </tr>`,
        )}</tbody>
      </table>
    <//>
    ${list.data && rows.length === 0 && html`<p class="muted">${t('hooks.noDeliveries')}</p>`}
  </section>`
}
