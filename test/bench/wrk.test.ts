import { describe, expect, test } from 'bun:test'
import { luaString, parseWrkOutput, wrkScript } from '../../bench/wrk.ts'

describe('wrk script', () => {
  test('long strings survive closing brackets in the text', () => {
    expect(luaString('a')).toBe('[[a]]')
    expect(luaString('x]]y')).toBe('[=[x]]y]=]')
    expect(luaString('x]]y]=]z')).toBe('[==[x]]y]=]z]==]')
  })

  test('POST with the body and every header; done() prints one JSON line', () => {
    const s = wrkScript(
      { authorization: 'Bearer sk-1', 'x-portkey-config': '{"targets":[[1]]}' },
      '{"a":[1]}',
    )
    expect(s).toContain('wrk.method = "POST"')
    expect(s).toContain('wrk.body = [[{"a":[1]}]]')
    // A space keeps `[` + `[[` from opening a long string.
    expect(s).toContain('wrk.headers[ [[authorization]] ] = [[Bearer sk-1]]')
    expect(s).toContain('wrk.headers[ [[x-portkey-config]] ] = [=[{"targets":[[1]]}]=]')
    expect(s).toContain('latency:percentile(99.9)')
  })

  test('parses the summary line, latencies to ms', () => {
    const out =
      'Running 1s test\nWRK_JSON {"requests":2000,"duration_us":2000000,"errors":3,"p50":1500,"p99":4000,"p999":9000}\n'
    const r = parseWrkOutput(out, 64, 2)
    expect(r.rps).toBe(1000)
    expect(r.errors).toBe(3)
    expect(r.p50).toBe(1.5)
    expect(r.p99).toBe(4)
    expect(r.p999).toBe(9)
    expect(() => parseWrkOutput('no summary', 1, 1)).toThrow()
  })
})
