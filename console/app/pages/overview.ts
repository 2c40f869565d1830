import { html } from 'htm/preact'
import { useMemo, useState } from 'preact/hooks'
import uPlot from 'uplot'
import { api, qs } from '../api.ts'
import { Chart, PALETTE } from '../chart.ts'
import { lang, num, rub, t } from '../i18n.ts'
import { ErrorBox, useLoad } from '../ui.ts'

interface Sums {
  requests: number
  cost_rub: number
  prompt_tokens: number
  completion_tokens: number
}
interface Point extends Sums {
  start: number
  groups?: (Sums & { model: string | null })[]
}
interface Series {
  data: Point[]
}

/** The browser's zone when the series accepts it (whole-hour offsets), else UTC. */
const zone = () => Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC'

async function series(params: Record<string, string | number>): Promise<Series> {
  try {
    return await api<Series>(`/usage/series${qs({ ...params, tz: zone() })}`)
  } catch {
    return await api<Series>(`/usage/series${qs({ ...params, tz: 'UTC' })}`)
  }
}

const bars = uPlot.paths.bars!({ size: [0.6, 60] })

const RANGES = {
  '24h': { bucket: 'hour', sec: 86_400 },
  '7d': { bucket: 'day', sec: 7 * 86_400 },
  '30d': { bucket: 'day', sec: 30 * 86_400 },
} as const
type Range = keyof typeof RANGES

export function Overview() {
  const org = useLoad(() => api<{ balance_rub: number }>('/organization'))
  const month = useLoad(() => {
    const now = new Date()
    const from = Math.floor(new Date(now.getFullYear(), now.getMonth(), 1).getTime() / 1000)
    return series({ bucket: 'day', from, to: Math.floor(now.getTime() / 1000) + 1 })
  })
  const [range, setRange] = useState<Range>('7d')
  const chart = useLoad(() => {
    const to = Math.floor(Date.now() / 1000) + 1
    const r = RANGES[range]
    return series({ bucket: r.bucket, group_by: 'model', from: to - r.sec, to })
  }, [range])
  const totals = useMemo(() => {
    const d = month.data?.data ?? []
    const sum = (f: (p: Point) => number) => d.reduce((a, p) => a + f(p), 0)
    return {
      today: d.at(-1)?.cost_rub ?? 0,
      month: sum((p) => p.cost_rub),
      requests: sum((p) => p.requests),
      tokens: sum((p) => p.prompt_tokens + p.completion_tokens),
    }
  }, [month.data])
  const plot = useMemo(() => chartOf(chart.data, range), [chart.data, range])
  const cards: [string, string, string][] = [
    ['balance', t('overview.balance'), rub(org.data?.balance_rub)],
    ['today', t('overview.today'), rub(totals.today)],
    ['month', t('overview.month'), rub(totals.month)],
    ['requests', t('overview.requests'), num(totals.requests)],
    ['tokens', t('overview.tokens'), num(totals.tokens)],
  ]
  return html`<div>
    <${ErrorBox} error=${org.error ?? month.error ?? chart.error} />
    <dl class="cards">
      ${cards.map(
        ([id, k, v]) =>
          html`<div class="card" data-testid=${`card-${id}`}><dt>${k}</dt><dd>${org.data ? v : '…'}</dd></div>`,
      )}
    </dl>
    <section aria-labelledby="chart-title">
      <div class="row spread">
        <h2 id="chart-title">${t('overview.chart')}</h2>
        <label>${t('overview.range')}${' '}
          <select value=${range} onChange=${(e: Event) => setRange((e.currentTarget as HTMLSelectElement).value as Range)}>
            ${(Object.keys(RANGES) as Range[]).map((r) => html`<option value=${r}>${t(`overview.range.${r}`)}</option>`)}
          </select>
        </label>
      </div>
      ${plot && html`<${Chart} opts=${plot.opts} data=${plot.data} label=${t('overview.chart')} />`}
      ${plot?.empty && html`<p class="muted">${t('overview.empty')}</p>`}
      ${
        plot &&
        html`<ul class="legend" data-testid="chart-models">
        ${plot.models.map((m, i) => html`<li><span class="swatch" style=${{ background: PALETTE[i % PALETTE.length] }}></span>${m}</li>`)}
      </ul>`
      }
    </section>
  </div>`
}

/** Spend per model (lines, left axis) and all requests (bars, right axis) per bucket. */
function chartOf(s: Series | undefined, range: Range) {
  if (!s) return undefined
  const models = [...new Set(s.data.flatMap((p) => (p.groups ?? []).map((g) => g.model ?? '?')))].sort()
  const xs = s.data.map((p) => p.start)
  const spend = models.map((m) =>
    s.data.map((p) => p.groups?.find((g) => (g.model ?? '?') === m)?.cost_rub ?? 0),
  )
  const requests = s.data.map((p) => p.requests)
  const locale = lang.value === 'ru' ? 'ru-RU' : 'en-US'
  const fmt = new Intl.DateTimeFormat(
    locale,
    RANGES[range].bucket === 'hour'
      ? { hour: '2-digit', minute: '2-digit' }
      : { day: 'numeric', month: 'short' },
  )
  const opts: Omit<uPlot.Options, 'width' | 'height'> = {
    series: [
      {},
      ...models.map((m, i) => ({
        label: m,
        stroke: PALETTE[i % PALETTE.length],
        width: 2,
        value: (_: uPlot, v: number | null) => rub(v, 2),
      })),
      {
        label: t('overview.requestsAxis'),
        scale: 'req',
        stroke: '#777',
        fill: 'rgba(120,120,120,0.15)',
        paths: bars,
        points: { show: false },
      },
    ],
    axes: [
      {
        values: (_u: uPlot, vals: number[]) => vals.map((v) => fmt.format(v * 1000)),
        // Ticks on whole buckets only, so a day's label is never repeated.
        incrs:
          RANGES[range].bucket === 'hour'
            ? [3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600]
            : [86_400, 2 * 86_400, 7 * 86_400],
      },
      { label: t('overview.spend'), size: 70 },
      { side: 1, scale: 'req', label: t('overview.requestsAxis'), grid: { show: false } },
    ],
    scales: {
      x: { time: true },
      req: { range: (_u: uPlot, _min: number, max: number) => [0, Math.max(1, max)] },
    },
    legend: { show: false },
  }
  return {
    opts,
    data: [xs, ...spend, requests] as uPlot.AlignedData,
    models,
    empty: requests.every((r) => r === 0),
  }
}
