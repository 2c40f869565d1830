import { html } from 'htm/preact'
import { useEffect, useRef, useState } from 'preact/hooks'
import type uPlot from 'uplot'
import { ApiError, api } from '../api.ts'
import { Chart } from '../chart.ts'
import { num, t, when } from '../i18n.ts'
import { ErrorBox, Scroll } from '../ui.ts'

interface Node {
  node: string
  models: string[]
  healthy: boolean
  ejected: boolean
  in_flight: number
  requests: number
  failures: number
  prefill_tokens_per_sec: number | null
  itl_ms: number | null
  rtt_ms: number | null
  ttft_ms: { p50: number | null; p90: number | null; p99: number | null; samples: number }
}
interface Fleet {
  at_ms: number
  data: Node[]
}

/** Points kept per node for the TTFT sparkline: two minutes at one poll every 2 s. */
const HISTORY = 60
const EVERY_MS = 2000

const SPARK: Omit<uPlot.Options, 'width' | 'height'> = {
  series: [{}, { stroke: '#1f5fbf', width: 1.5, points: { show: false } }],
  axes: [{ show: false }, { show: false }],
  scales: { x: { time: false }, y: { range: (_u, _min, max) => [0, Math.max(1, max * 1.1)] } },
  legend: { show: false },
  cursor: { show: false },
}

export function Fleet() {
  const [fleet, setFleet] = useState<Fleet | null>(null)
  const [error, setError] = useState<string | null>(null)
  const history = useRef(new Map<string, number[]>())
  useEffect(() => {
    let live = true
    const poll = async () => {
      try {
        const f = await api<Fleet>('/admin/fleet')
        if (!live) return
        for (const n of f.data) {
          const h = history.current.get(n.node) ?? []
          h.push(n.ttft_ms.p50 ?? 0)
          if (h.length > HISTORY) h.shift()
          history.current.set(n.node, h)
        }
        setFleet(f)
        setError(null)
      } catch (e) {
        if (live) setError(e instanceof ApiError ? e.message : String(e))
      }
    }
    void poll()
    const timer = setInterval(poll, EVERY_MS)
    return () => {
      live = false
      clearInterval(timer)
    }
  }, [])
  const health = (n: Node) =>
    n.ejected
      ? ['ejected', t('fleet.ejected')]
      : n.healthy
        ? ['healthy', t('fleet.healthy')]
        : ['failing', t('fleet.failing')]
  return html`<div>
    <${ErrorBox} error=${error} />
    <p class="muted" aria-live="polite">${fleet && t('fleet.updated', { time: when(Math.floor(fleet.at_ms / 1000)) })}</p>
    <${Scroll} label=${t('nav.fleet')}>
      <table>
        <thead><tr>
          <th scope="col">${t('fleet.node')}</th>
          <th scope="col">${t('fleet.health')}</th>
          <th scope="col" class="num">${t('fleet.inFlight')}</th>
          <th scope="col" class="num">${t('fleet.prefill')}</th>
          <th scope="col" class="num">${t('fleet.itl')}</th>
          <th scope="col" class="num">${t('fleet.rtt')}</th>
          <th scope="col" class="num">${t('fleet.ttft')}</th>
          <th scope="col">${t('fleet.trend')}</th>
          <th scope="col" class="num">${t('fleet.errors')}</th>
        </tr></thead>
        <tbody>
          ${(fleet?.data ?? []).map((n) => {
            const [cls, label] = health(n)
            const h = history.current.get(n.node) ?? []
            return html`<tr data-node=${n.node}>
              <td><strong>${n.node}</strong><br /><span class="muted">${n.models.join(', ')}</span></td>
              <td><span class=${`status ${cls}`}>${label}</span></td>
              <td class="num" data-testid="in-flight">${num(n.in_flight)}</td>
              <td class="num">${num(n.prefill_tokens_per_sec)}</td>
              <td class="num">${num(n.itl_ms, 1)}</td>
              <td class="num">${num(n.rtt_ms, 1)}</td>
              <td class="num">${num(n.ttft_ms.p50)} / ${num(n.ttft_ms.p90)} / ${num(n.ttft_ms.p99)}</td>
              <td class="spark"><${Chart} opts=${SPARK} data=${[h.map((_, i) => i), h] as uPlot.AlignedData} height=${32} label=${`${t('fleet.trend')}: ${n.node}`} /></td>
              <td class="num">${num(n.requests)} / ${num(n.failures)}</td>
            </tr>`
          })}
        </tbody>
      </table>
    <//>
  </div>`
}
