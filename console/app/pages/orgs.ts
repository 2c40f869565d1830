import { html } from 'htm/preact'
import { useState } from 'preact/hooks'
import { api } from '../api.ts'
import { rub, t, when } from '../i18n.ts'
import { ErrorBox, Scroll, Secret, useAction, useLoad } from '../ui.ts'

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
  const [open, setOpen] = useState<Org | null>(null)
  const [note, setNote] = useState<string | null>(null)
  const action = useAction(list.reload)
  const error = action.error
  const run = (f: () => Promise<void>) => {
    setNote(null)
    return action.run(f)
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
  // One form per organization: an amount, a reason (kept in the ledger; a debit needs one) and
  // two buttons, Credit and Debit.
  const credit = (o: Org) => (e: SubmitEvent) => {
    e.preventDefault()
    const form = e.currentTarget as HTMLFormElement
    const debit = (e.submitter as HTMLButtonElement | null)?.value === 'debit'
    const amount = amountOf((form.elements.namedItem('amount') as HTMLInputElement).value)
    const reason = (form.elements.namedItem('reason') as HTMLInputElement).value.trim()
    return run(async () => {
      const after = await api<Org>(`/admin/organizations/${o.id}/${debit ? 'debit' : 'credit'}`, 'POST', {
        amount_rub: amount,
        ...(reason && { reason }),
      })
      form.reset()
      setNote(
        t(debit ? 'orgs.debited' : 'orgs.credited', { name: after.name, balance: rub(after.balance_rub) }),
      )
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
          <th scope="col">${t('orgs.creditDebit')}</th>
          <th scope="col">${t('orgs.masterKeys')}</th>
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
                  <input name="reason" maxlength="500" placeholder=${t('orgs.reason')} aria-label=${t('orgs.reasonFor', { name: o.name })} />
                  <button type="submit" value="credit" aria-label=${`${t('orgs.credit')} ${o.name}`}>${t('orgs.credit')}</button>
                  <button type="submit" value="debit" class="secondary" aria-label=${`${t('orgs.debit')} ${o.name}`}>${t('orgs.debit')}</button>
                </form>
              </td>
              <td>
                <button type="button" class="secondary" aria-label=${`${t('orgs.masterKeys')}: ${o.name}`}
                  aria-expanded=${open?.id === o.id} onClick=${() => setOpen(open?.id === o.id ? null : o)}>${t('orgs.masterKeys')}</button>
              </td>
            </tr>`,
          )}
        </tbody>
      </table>
    <//>
    ${open && html`<${MasterKeys} key=${open.id} org=${open} onClose=${() => setOpen(null)} />`}
  </div>`
}

interface MasterKey {
  key_id: string
  name: string
  key_hint: string
  status: 'active' | 'disabled' | 'revoked'
  created_at: number
  last_used_at: number | null
}

/** An organization's master keys: issue one (shown once), revoke one after a confirmation. */
function MasterKeys({ org, onClose }: { org: Org; onClose: () => void }) {
  const base = `/admin/organizations/${org.id}/master_keys`
  const list = useLoad(() => api<{ data: MasterKey[] }>(base))
  const [secret, setSecret] = useState<string | null>(null)
  const [confirm, setConfirm] = useState<string | null>(null)
  const { error, run } = useAction(list.reload)
  const issue = (e: Event) => {
    e.preventDefault()
    const form = e.currentTarget as HTMLFormElement
    const name = (form.elements.namedItem('name') as HTMLInputElement).value.trim()
    return run(async () => {
      const k = await api<{ key: string }>(base, 'POST', { name })
      form.reset()
      setSecret(k.key)
    })
  }
  const title = t('orgs.masterKeysOf', { name: org.name })
  return html`<section class="panel" aria-label=${title}>
    <div class="row spread">
      <h2>${title}</h2>
      <button type="button" class="secondary" onClick=${onClose}>${t('orgs.close')}</button>
    </div>
    <${ErrorBox} error=${error ?? list.error} />
    ${secret && html`<${Secret} title=${t('orgs.masterTitle', { name: org.name })} secret=${secret} onDone=${() => setSecret(null)} />`}
    <form class="inline" onSubmit=${issue} aria-label=${t('orgs.issue')}>
      <label>${t('common.name')} <input name="name" required maxlength="128" /></label>
      <button type="submit">${t('orgs.issue')}</button>
    </form>
    <${Scroll} label=${title}>
      <table>
        <thead><tr>
          <th scope="col">${t('common.name')}</th>
          <th scope="col">${t('keys.hint')}</th>
          <th scope="col">${t('common.status')}</th>
          <th scope="col">${t('common.created')}</th>
          <th scope="col">${t('common.actions')}</th>
        </tr></thead>
        <tbody>
          ${(list.data?.data ?? []).map(
            (k) => html`<tr data-master=${k.name}>
              <td>${k.name}</td>
              <td><code>${k.key_hint}</code></td>
              <td><span class=${`status ${k.status}`}>${t(`status.${k.status}`)}</span></td>
              <td>${when(k.created_at)}</td>
              <td class="actions">
                ${
                  k.status === 'revoked'
                    ? null
                    : confirm === k.key_id
                      ? html`<div role="alertdialog" aria-label=${t('keys.revoke')} class="confirm">
                          <p>${t('keys.revokeConfirm', { name: k.name })}</p>
                          <button type="button" class="danger" onClick=${() =>
                            run(async () => {
                              await api(`${base}/${k.key_id}`, 'DELETE')
                              setConfirm(null)
                            })}>${t('keys.revokeYes')}</button>
                          <button type="button" class="secondary" onClick=${() => setConfirm(null)}>${t('common.cancel')}</button>
                        </div>`
                      : html`<button type="button" class="danger" aria-label=${`${t('keys.revoke')} ${k.name}`} onClick=${() => setConfirm(k.key_id)}>${t('keys.revoke')}</button>`
                }
              </td>
            </tr>`,
          )}
        </tbody>
      </table>
    <//>
  </section>`
}
