import { describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import {
  type Dashboard,
  dashboardVars,
  formatValue,
  legendName,
  onGrid,
  substitute,
} from '../../scripts/dashboard-screenshot.ts'

// The pure parts of scripts/dashboard-screenshot.ts: what Grafana does with the dashboard's
// variables, legends and units, and the PNG it writes.

const dashboard = JSON.parse(
  readFileSync(join(import.meta.dir, '../../docs/observability/grafana-dashboard.json'), 'utf8'),
) as Dashboard

describe('the dashboard variables as Grafana fills them with All selected', () => {
  const vars = dashboardVars(dashboard, { interval: '2s', rateInterval: '15s', range: '180s' })

  test('model and endpoint become their allValue; the datasource variable is not a value', () => {
    expect(vars.model).toBe('.*')
    expect(vars.endpoint).toBe('.*')
    expect(vars.datasource).toBeUndefined()
  })

  test('every spelling of a variable is replaced', () => {
    expect(substitute('a{m=~"$model"}[$__rate_interval]', vars)).toBe('a{m=~".*"}[15s]')
    // biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's ${name}, not a template
    expect(substitute('a{m=~"${model}",e=~"[[endpoint]]"}[${__interval}]', vars)).toBe(
      'a{m=~".*",e=~".*"}[2s]',
    )
    // biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's ${name:format}, not a template
    expect(substitute('a{m=~"${model:regex}"}[$__range]', vars)).toBe('a{m=~".*"}[180s]')
  })

  test('a variable the dashboard does not define is an error, not left for Prometheus', () => {
    expect(() => substitute('rate(x[$__rate_interval]) / $nope', vars)).toThrow('unknown variable $nope')
  })

  test("every target of the dashboard is left with no '$'", () => {
    const exprs = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr ?? ''))
    expect(exprs.length).toBeGreaterThan(20)
    for (const e of exprs) expect(substitute(e, vars)).not.toContain('$')
  })

  test('a variable without an All option cannot be rendered', () => {
    const d: Dashboard = { title: 't', panels: [], templating: { list: [{ name: 'org', type: 'query' }] } }
    expect(() => dashboardVars(d, { interval: '1s', rateInterval: '4s', range: '60s' })).toThrow('$org')
  })
})

describe('legends and units', () => {
  test('legendFormat takes the labels; without one, the labels as Prometheus writes them', () => {
    expect(
      legendName('{{endpoint}} {{ model }}', { endpoint: '/v1/embeddings', model: 'sim/embed-small' }),
    ).toBe('/v1/embeddings sim/embed-small')
    expect(legendName('p95 {{missing}}', {})).toBe('p95')
    expect(legendName(undefined, { __name__: 'up', job: 'tropa' })).toBe('up{job="tropa"}')
  })

  test('values as Grafana writes them in this dashboard units', () => {
    expect(formatValue('reqps', 8.014)).toBe('8.01 req/s')
    expect(formatValue('percentunit', 0.0312)).toBe('3.12%')
    expect(formatValue('s', 0.000287)).toBe('287 µs')
    expect(formatValue('s', 1.31)).toBe('1.31 s')
    expect(formatValue('s', 0.5454)).toBe('545 ms')
    expect(formatValue('short', 12_500)).toBe('12.5 K')
    expect(formatValue('none', 1155.4)).toBe('1155')
    expect(formatValue('none', null)).toBe('–')
  })

  test('a matrix lands on the grid; NaN (a quantile of no observations) is a gap', () => {
    expect(
      onGrid(
        [
          [100, '1'],
          [104, 'NaN'],
          [106, '3'],
        ],
        100,
        2,
        4,
      ),
    ).toEqual([1, null, null, 3])
  })
})

describe('the indexed PNG', () => {})
