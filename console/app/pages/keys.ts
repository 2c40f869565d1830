import { html } from 'htm/preact'
import { useState } from 'preact/hooks'
import { api } from '../api.ts'
import { rub, t, when } from '../i18n.ts'
import { Bar, ErrorBox, Scroll, Secret, useAction, useLoad } from '../ui.ts'

interface Key {
  key_id: string
  name: string
  key_hint: string
  limit_rub: number | null
  spent_rub: number
  status: 'active' | 'disabled' | 'revoked'
  created_at: number
  last_used_at: number | null
}

/** A limit field: empty means none; otherwise roubles (a comma is read as the decimal point). */
const limitOf = (v: string): number | null => (v.trim() === '' ? null : Number(v.trim().replace(',', '.')))

export function Keys() {
  const list = useLoad(() => api<{ data: Key[] }>('/keys?limit=1000'))
  const [secret, setSecret] = useState<string | null>(null)
  const { error, run: act } = useAction(list.reload)
  const create = (e: Event) => {
    e.preventDefault()
    const form = e.currentTarget as HTMLFormElement
    const name = (form.elements.namedItem('name') as HTMLInputElement).value.trim()
    const limit = limitOf((form.elements.namedItem('limit') as HTMLInputElement).value)
    return act(async () => {
      const k = await api<{ key: string }>('/keys', 'POST', { name, limit_rub: limit })
      form.reset()
      setSecret(k.key)
    })
  }
  return html`<div>
    <${ErrorBox} error=${error ?? list.error} />
    ${secret && html`<${Secret} title=${t('keys.secretTitle')} secret=${secret} onDone=${() => setSecret(null)} />`}
    <form class="inline" onSubmit=${create} aria-label=${t('keys.create')}>
      <label>${t('common.name')} <input name="name" required maxlength="128" /></label>
      <label>${t('keys.limit')} <input name="limit" inputmode="decimal" pattern="[0-9]+([.,][0-9]{1,6})?" /></label>
      <button type="submit">${t('keys.create')}</button>
    </form>
    <${Scroll} label=${t('nav.keys')}>
      <table>
        <thead><tr>
          <th scope="col">${t('common.name')}</th>
          <th scope="col">${t('keys.hint')}</th>
          <th scope="col">${t('keys.spent')}</th>
          <th scope="col">${t('common.status')}</th>
          <th scope="col">${t('keys.lastUse')}</th>
          <th scope="col">${t('common.actions')}</th>
        </tr></thead>
        <tbody>${(list.data?.data ?? []).map((k) => html`<${Row} key=${k.key_id} k=${k} act=${act} />`)}</tbody>
      </table>
    <//>
  </div>`
}

function Row({ k, act }: { k: Key; act: (f: () => Promise<unknown>) => Promise<void> }) {
  const [mode, setMode] = useState<'view' | 'edit' | 'revoke'>('view')
  const patch = (body: Record<string, unknown>) => act(() => api(`/keys/${k.key_id}`, 'PATCH', body))
  const save = (e: Event) => {
    e.preventDefault()
    const form = e.currentTarget as HTMLFormElement
    const name = (form.elements.namedItem('name') as HTMLInputElement).value.trim()
    const limit = limitOf((form.elements.namedItem('limit') as HTMLInputElement).value)
    return patch({ name, limit_rub: limit }).then(() => setMode('view'))
  }
  const live = k.status !== 'revoked'
  return html`<tr data-key=${k.name}>
    <td>${
      mode === 'edit'
        ? html`<form class="inline" onSubmit=${save}>
            <label>${t('common.name')} <input name="name" required maxlength="128" value=${k.name} /></label>
            <label>${t('keys.limit')} <input name="limit" inputmode="decimal" value=${k.limit_rub ?? ''} /></label>
            <button type="submit">${t('common.save')}</button>
            <button type="button" class="secondary" onClick=${() => setMode('view')}>${t('common.cancel')}</button>
          </form>`
        : k.name
    }</td>
    <td><code>${k.key_hint}</code></td>
    <td class="spent">
      ${k.limit_rub === null ? html`${rub(k.spent_rub)} <span class="muted">(${t('keys.noLimit')})</span>` : html`${rub(k.spent_rub)} / ${rub(k.limit_rub)}`}
      ${k.limit_rub !== null && html`<${Bar} value=${k.spent_rub} max=${k.limit_rub} label=${`${k.name}: ${t('keys.spent')}`} />`}
    </td>
    <td><span class=${`status ${k.status}`}>${t(`status.${k.status}`)}</span></td>
    <td>${k.last_used_at === null ? t('keys.never') : when(k.last_used_at)}</td>
    <td class="actions">
      ${
        mode === 'revoke'
          ? html`<div role="alertdialog" aria-label=${t('keys.revoke')} class="confirm">
              <p>${t('keys.revokeConfirm', { name: k.name })}</p>
              <button type="button" class="danger" onClick=${() => act(() => api(`/keys/${k.key_id}`, 'DELETE'))}>${t('keys.revokeYes')}</button>
              <button type="button" class="secondary" onClick=${() => setMode('view')}>${t('common.cancel')}</button>
            </div>`
          : live &&
            html`<button type="button" class="secondary" aria-label=${`${t('keys.edit')} ${k.name}`} onClick=${() => setMode('edit')}>${t('keys.edit')}</button>
              ${
                k.status === 'active'
                  ? html`<button type="button" class="secondary" aria-label=${`${t('keys.disable')} ${k.name}`} onClick=${() => patch({ disabled: true })}>${t('keys.disable')}</button>`
                  : html`<button type="button" class="secondary" aria-label=${`${t('keys.enable')} ${k.name}`} onClick=${() => patch({ disabled: false })}>${t('keys.enable')}</button>`
              }
              <button type="button" class="danger" aria-label=${`${t('keys.revoke')} ${k.name}`} onClick=${() => setMode('revoke')}>${t('keys.revoke')}</button>`
      }
    </td>
  </tr>`
}
