import { html } from 'htm/preact'
import { useState } from 'preact/hooks'
import { api } from '../api.ts'
import { rub, t, when } from '../i18n.ts'
import { ErrorBox, messageOf, Scroll, Secret, useLoad } from '../ui.ts'

interface Org {
  id: string
  name: string
  balance_rub: number
  created_at: number
}

const amountOf = (v: string) => Number(v.trim().replace(',', '.'))

export function Orgs() {
  const list = useLoad(() => api<{ data: Org[] }>('/admin/organizations'))
  const [created, setCreated] = useState<{ name: string; key: string } | null>(null)
  const [note, setNote] = useState<string | null>(null)
  const [error, setError] = useState<string | null>(null)
  const run = async (f: () => Promise<void>) => {
    setError(null)
    setNote(null)
    try {
      await f()
      list.reload()
    } catch (e) {
      setError(messageOf(e))
    }
  }
  const create = (e: Event) => {
    e.preventDefault()
    const form = e.currentTarget as HTMLFormElement
    const name = (form.elements.namedItem('name') as HTMLInputElement).value.trim()
    const initial = (form.elements.namedItem('balance') as HTMLInputElement).value
    return run(async () => {
      const o = await api<{ name: string; master_key: string }>('/admin/organizations', 'POST', {
        name,
        ...(initial.trim() && { balance_rub: amountOf(initial) }),
      })
      form.reset()
      setCreated({ name: o.name, key: o.master_key })
    })
  }
  const credit = (o: Org) => (e: Event) => {
    e.preventDefault()
    const form = e.currentTarget as HTMLFormElement
    const amount = amountOf((form.elements.namedItem('amount') as HTMLInputElement).value)
    return run(async () => {
      const after = await api<Org>(`/admin/organizations/${o.id}/credit`, 'POST', { amount_rub: amount })
      form.reset()
      setNote(t('orgs.credited', { name: after.name, balance: rub(after.balance_rub) }))
    })
  }
  return html`<div>
    <${ErrorBox} error=${error ?? list.error} />
    ${note && html`<p class="note" role="status">${note}</p>`}
    ${created && html`<${Secret} title=${t('orgs.masterTitle', { name: created.name })} secret=${created.key} onDone=${() => setCreated(null)} />`}
    <form class="inline" onSubmit=${create} aria-label=${t('orgs.create')}>
      <label>${t('common.name')} <input name="name" required maxlength="128" /></label>
      <label>${t('orgs.initial')} <input name="balance" inputmode="decimal" pattern="[0-9]+([.,][0-9]{1,6})?" /></label>
      <button type="submit">${t('orgs.create')}</button>
    </form>
    <${Scroll} label=${t('nav.orgs')}>
      <table>
        <thead><tr>
          <th scope="col">${t('common.name')}</th>
          <th scope="col">ID</th>
          <th scope="col" class="num">${t('orgs.balance')}</th>
          <th scope="col">${t('common.created')}</th>
          <th scope="col">${t('orgs.credit')}</th>
        </tr></thead>
        <tbody>
          ${(list.data?.data ?? []).map(
            (o) => html`<tr data-org=${o.name}>
              <td>${o.name}</td>
              <td><code>${o.id}</code></td>
              <td class="num">${rub(o.balance_rub)}</td>
              <td>${when(o.created_at)}</td>
              <td>
                <form class="inline" onSubmit=${credit(o)}>
                  <input name="amount" required inputmode="decimal" pattern="[0-9]+([.,][0-9]{1,6})?" aria-label=${t('orgs.creditFor', { name: o.name })} />
                  <button type="submit" aria-label=${`${t('orgs.credit')} ${o.name}`}>${t('orgs.credit')}</button>
                </form>
              </td>
            </tr>`,
          )}
        </tbody>
      </table>
    <//>
  </div>`
}
