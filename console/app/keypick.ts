import { html } from 'htm/preact'
import { useEffect, useState } from 'preact/hooks'
import { api } from './api.ts'
import { t } from './i18n.ts'
import { useLoad } from './ui.ts'

/** The key chosen last, kept while the page lives (an id: the secret is never needed). */
let chosen: string | undefined

/** Picks one of the organization's active API keys; the console's calls then bill that key. */
export function useKeyPick() {
  const keys = useLoad(() =>
    api<{ data: { key_id: string; name: string }[] }>('/keys?status=active&limit=1000'),
  )
  const list = keys.data?.data ?? []
  const [keyId, setKeyId] = useState<string | undefined>(chosen)
  useEffect(() => {
    if (list.length > 0 && !list.some((k) => k.key_id === keyId)) setKeyId(list[0]!.key_id)
  }, [list, keyId])
  chosen = keyId
  const picker = html`<label>${t('pick.key')}
    <select name="key" value=${keyId ?? ''} onChange=${(e: Event) => setKeyId((e.currentTarget as HTMLSelectElement).value)}>
      ${list.map((k) => html`<option value=${k.key_id}>${k.name}</option>`)}
    </select>
  </label>`
  const none =
    keys.data && list.length === 0 ? html`<p class="note" role="status">${t('pick.none')}</p>` : null
  return { keyId: list.some((k) => k.key_id === keyId) ? keyId : undefined, picker, none }
}
