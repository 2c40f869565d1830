import { html } from 'htm/preact'
import { api, type Session } from '../api.ts'
import { num, rub, t } from '../i18n.ts'
import { ErrorBox, Scroll, useLoad } from '../ui.ts'

interface Model {
  id: string
  owned_by: string
  context_length: number
  pricing: { prompt: string; completion: string }
}

/** Roubles per token (decimal text, six digits) as roubles per million tokens, exactly. */
export function perMillion(perToken: string): number {
  const [whole = '0', frac = ''] = perToken.split('.')
  const f = frac.padEnd(6, '0')
  return Number(`${BigInt(whole) * 1_000_000n + BigInt(f.slice(0, 6))}.${f.slice(6) || '0'}`)
}

export function Models({ session }: { session: Session }) {
  const { data, error } = useLoad(() => api<{ data: Model[] }>('/models'))
  // The operator also sees which nodes serve each model (the routes as configured).
  const operator = session.role === 'operator'
  const fleet = useLoad(() =>
    operator
      ? api<{ data: { node: string; models: string[] }[] }>('/admin/fleet')
      : Promise.resolve({ data: [] }),
  )
  const nodesOf = (id: string) =>
    (fleet.data?.data ?? [])
      .filter((n) => n.models.includes(id))
      .map((n) => n.node)
      .join(', ')
  return html`<div>
    <${ErrorBox} error=${error} />
    <${Scroll} label=${t('nav.models')}>
      <table>
        <thead><tr>
          <th scope="col">${t('models.id')}</th>
          <th scope="col">${t('models.owner')}</th>
          <th scope="col" class="num">${t('models.context')}</th>
          <th scope="col" class="num">${t('models.prompt')}</th>
          <th scope="col" class="num">${t('models.completion')}</th>
          ${operator && html`<th scope="col">${t('models.nodes')}</th>`}
        </tr></thead>
        <tbody>
          ${(data?.data ?? []).map(
            (m) => html`<tr>
              <td><code>${m.id}</code></td>
              <td>${m.owned_by}</td>
              <td class="num">${num(m.context_length)}</td>
              <td class="num">${rub(perMillion(m.pricing.prompt))}</td>
              <td class="num">${rub(perMillion(m.pricing.completion))}</td>
              ${operator && html`<td>${nodesOf(m.id)}</td>`}
            </tr>`,
          )}
        </tbody>
      </table>
    <//>
  </div>`
}
