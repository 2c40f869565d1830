import { html } from 'htm/preact'
import { useEffect, useRef } from 'preact/hooks'
import uPlot from 'uplot'

/** Distinct colours with enough contrast on white. */
export const PALETTE = ['#1f5fbf', '#b3261e', '#1b7a3a', '#8a4baf', '#a05a00', '#006b75', '#5d5d5d']

/** A uPlot chart in a box as wide as its parent; rebuilt when `opts` or `data` change. */
export function Chart({
  opts,
  data,
  label,
  height = 260,
}: {
  opts: Omit<uPlot.Options, 'width' | 'height'>
  data: uPlot.AlignedData
  label: string
  height?: number
}) {
  const box = useRef<HTMLDivElement>(null)
  useEffect(() => {
    const el = box.current!
    const plot = new uPlot({ ...opts, width: el.clientWidth || 300, height }, data, el)
    const ro = new ResizeObserver(() => plot.setSize({ width: el.clientWidth || 300, height }))
    ro.observe(el)
    return () => {
      ro.disconnect()
      plot.destroy()
    }
  }, [opts, data, height])
  return html`<div class="chart" ref=${box} role="img" aria-label=${label}></div>`
}
