import { describe, expect, test } from 'bun:test'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ConfigError, loadConfig } from '../../src/config/load.ts'

const dir = mkdtempSync(join(tmpdir(), 'tropa-config-'))
let n = 0
function write(text: string, ext = 'toml') {
  const p = join(dir, `c${n++}.${ext}`)
  writeFileSync(p, text)
  return p
}
function problems(text: string, env: Record<string, string> = {}): string[] {
  try {
    loadConfig({ configPath: write(text) }, env)
  } catch (err) {
    if (err instanceof ConfigError) return [...err.problems]
    throw err
  }
  return []
}

const GOOD = `
[server]
port = 9000

[[models]]
id = "acme/chat-1"
context_length = 8192
[models.pricing_per_million]
prompt = "30"
completion = "60"
[[models.routes]]
base_url = "http://127.0.0.1:9101/v1"
upstream_model = "chat"
api_key_env = "ACME_KEY"
`

describe('config', () => {
  test('a good TOML file loads, with per-million prices converted exactly', () => {
    const c = loadConfig({ configPath: write(GOOD) }, { ACME_KEY: 'secret' })
    expect(c.server.port).toBe(9000)
    const m = c.models[0]!
    expect(m.ownedBy).toBe('acme')
    expect(m.price).toEqual({ promptNano: 30_000n, completionNano: 60_000n, cachedPromptNano: 30_000n })
    expect(m.routes[0]).toMatchObject({ apiKey: 'secret', upstreamModel: 'chat', node: '127.0.0.1:9101' })
    expect(Object.isFrozen(c.models[0])).toBe(true)
    expect(c.server.streamWriteTimeoutMs).toBe(30_000)
    expect(c.server.sseKeepAliveMs).toBe(15_000)
  })

  test('server.stream_write_timeout_ms: set, or refused out of range', () => {
    const c = loadConfig(
      { configPath: write(GOOD.replace('port = 9000', 'stream_write_timeout_ms = 5000')) },
      {
        ACME_KEY: 'k',
      },
    )
    expect(c.server.streamWriteTimeoutMs).toBe(5000)
    expect(
      problems(GOOD.replace('port = 9000', 'stream_write_timeout_ms = 0'), { ACME_KEY: 'k' }).join(),
    ).toContain('stream_write_timeout_ms')
  })

  test('environment and flags override the file', () => {
    const c = loadConfig(
      { configPath: write(GOOD), port: 7000 },
      { ACME_KEY: 'k', TROPA_DATA_DIR: '/tmp/x', TROPA_PORT: '8000' },
    )
    expect(c.server.port).toBe(7000)
    expect(c.server.dataDir).toBe('/tmp/x')
  })

  test('server.public_url: from the file or TROPA_PUBLIC_URL, trailing slash dropped; checked', () => {
    expect(loadConfig({ configPath: write(GOOD) }, { ACME_KEY: 'k' }).server.publicUrl).toBeUndefined()
    const file = GOOD.replace('port = 9000', 'port = 9000\npublic_url = "https://tropa.example.com/"')
    expect(loadConfig({ configPath: write(file) }, { ACME_KEY: 'k' }).server.publicUrl).toBe(
      'https://tropa.example.com',
    )
    const env = { ACME_KEY: 'k', TROPA_PUBLIC_URL: 'http://10.0.0.1:8080/tropa' }
    expect(loadConfig({ configPath: write(file) }, env).server.publicUrl).toBe('http://10.0.0.1:8080/tropa')
    for (const bad of ['tropa.example.com', 'ftp://x', 'https://x/?a=1', 'https://x/#f', 'https://u:p@x'])
      expect(problems(GOOD, { ACME_KEY: 'k', TROPA_PUBLIC_URL: bad }).join()).toContain('server.public_url')
  })

  test('JSON works too', () => {
    const c = loadConfig(
      {
        configPath: write(
          JSON.stringify({
            models: [
              {
                id: 'a/b',
                context_length: 10,
                pricing: { prompt: '0.000001', completion: '0.000002' },
                routes: [{ base_url: 'http://h:1/v1' }],
              },
            ],
          }),
          'json',
        ),
      },
      {},
    )
    expect(c.models[0]!.price.completionNano).toBe(2_000n)
  })

  const bad: [string, string, RegExp][] = [
    [
      'an unknown key',
      GOOD.replace('port = 9000', 'port = 9000\ncolour = "red"'),
      /server\.colour.*Fix: remove the unknown key/,
    ],
    [
      'a model without routes',
      GOOD.slice(0, GOOD.indexOf('[[models.routes]]')),
      /acme\/chat-1\): the model has no routes\. Fix: add/,
    ],
    [
      'an inexact price',
      GOOD.replace('prompt = "30"', 'prompt = "30.5"'),
      /pricing_per_million\.prompt 30\.5 is not a whole number/,
    ],
    [
      'a per-token price with seven digits',
      GOOD.replace(
        '[models.pricing_per_million]\nprompt = "30"\ncompletion = "60"',
        '[models.pricing]\nprompt = "0.0000305"\ncompletion = "0.000060"',
      ),
      /pricing\.prompt 0\.0000305 is not exact at six fractional digits/,
    ],
    [
      'a malformed URL',
      GOOD.replace('http://127.0.0.1:9101/v1', 'not a url'),
      /base_url "not a url" is not an http\(s\) URL/,
    ],
    ['a missing credential variable', GOOD, /api_key_env names ACME_KEY, which is not set/],
    ['a bad model id', GOOD.replace('acme/chat-1', 'no-slash'), /models\.0\.id/],
    ['no models', '[server]\nport = 1\n', /no models configured/],
    [
      'an embedding model without dimensions',
      GOOD.replace('context_length = 8192', 'context_length = 8192\nkind = "embedding"'),
      /needs dimensions/,
    ],
    ['an unknown TROPA_ variable', GOOD, /TROPA_PROT is not a Tropa setting/],
  ]
  test.each(bad)('%s stops the start with a message naming file, key and fix', (name, text, expected) => {
    const env: Record<string, string> = name === 'a missing credential variable' ? {} : { ACME_KEY: 'k' }
    if (name.includes('TROPA_')) env.TROPA_PROT = '1'
    const found = problems(text, env)
    expect(found.join('\n')).toMatch(expected)
    expect(found.join('\n')).toContain(name.includes('TROPA_') ? 'environment' : dir)
  })

  test('storage.sqlite_startup_check: quick by default, full or off, nothing else', () => {
    expect(loadConfig({ configPath: write(GOOD) }, { ACME_KEY: 'k' }).storage.sqliteStartupCheck).toBe(
      'quick',
    )
    const full = loadConfig(
      { configPath: write(`[storage]\nsqlite_startup_check = "full"\n${GOOD}`) },
      { ACME_KEY: 'k' },
    )
    expect(full.storage.sqliteStartupCheck).toBe('full')
    expect(
      problems(`[storage]\nsqlite_startup_check = "fast"\n${GOOD}`, { ACME_KEY: 'k' }).join('\n'),
    ).toContain('sqlite_startup_check')
  })

  test('TROPA_STREAM_CLIENT: fetch or own is a setting, anything else stops the start', () => {
    expect(problems(GOOD, { ACME_KEY: 'k', TROPA_STREAM_CLIENT: 'fetch' })).toEqual([])
    expect(problems(GOOD, { ACME_KEY: 'k', TROPA_STREAM_CLIENT: 'own' })).toEqual([])
    expect(problems(GOOD, { ACME_KEY: 'k', TROPA_STREAM_CLIENT: 'undici' }).join('\n')).toMatch(
      /TROPA_STREAM_CLIENT=undici is neither/,
    )
  })

  test('a file that does not parse', () => {
    expect(problems('[server\nport=')[0]).toMatch(/cannot parse/)
  })

  test('metrics and access log: defaults, TROPA_ACCESS_LOG, and capture needs a sink', () => {
    const c = loadConfig({ configPath: write(GOOD) }, { ACME_KEY: 'k' })
    expect(c.metrics).toEqual({ requests: true, perOrg: false, perOrgMax: 100 })
    expect(c.accessLog).toMatchObject({ sink: 'off', keep: 5, captureOrgs: [], captureKeys: [] })
    expect(c.accessLog.path.endsWith('access.log')).toBe(true)
    const env = loadConfig({ configPath: write(GOOD) }, { ACME_KEY: 'k', TROPA_ACCESS_LOG: 'stderr' })
    expect(env.accessLog.sink).toBe('stderr')
    const capture = problems(`${GOOD}\n[access_log]\ncapture_orgs = ["org_1"]\n`, { ACME_KEY: 'k' })
    expect(capture.some((p) => p.includes('access_log.capture_orgs'))).toBe(true)
    expect(problems(`${GOOD}\n[metrics]\nper_org_max = 0\n`, { ACME_KEY: 'k' }).length).toBeGreaterThan(0)
    expect(problems(`${GOOD}\n[access_log]\nsink = "syslog"\n`, { ACME_KEY: 'k' }).length).toBeGreaterThan(0)
  })
})

describe('cached prompt prices', () => {
  const model = (pricing: string) => `
[[models]]
id = "acme/chat-1"
context_length = 8192
${pricing}
[[models.routes]]
base_url = "http://127.0.0.1:9101/v1"
`
  test('pricing.cached_prompt and pricing_per_million.cached_prompt load exactly; absent, the prompt price', () => {
    const a = loadConfig(
      {
        configPath: write(
          model('[models.pricing]\nprompt = "0.000030"\ncompletion = "0.000060"\ncached_prompt = "0.000003"'),
        ),
      },
      {},
    )
    expect(a.models[0]!.price.cachedPromptNano).toBe(3_000n)
    const b = loadConfig(
      {
        configPath: write(
          model('[models.pricing_per_million]\nprompt = "30"\ncompletion = "60"\ncached_prompt = "15"'),
        ),
      },
      {},
    )
    expect(b.models[0]!.price.cachedPromptNano).toBe(15_000n)
    const c = loadConfig(
      { configPath: write(model('[models.pricing]\nprompt = "0.000030"\ncompletion = "0.000060"')) },
      {},
    )
    expect(c.models[0]!.price.cachedPromptNano).toBe(30_000n)
  })
  test('a cached price over the prompt price, or not exact at six digits, is refused', () => {
    expect(
      problems(
        model('[models.pricing]\nprompt = "0.000030"\ncompletion = "0.000060"\ncached_prompt = "0.000031"'),
      ).join(),
    ).toContain('over the prompt price')
    expect(
      problems(
        model('[models.pricing]\nprompt = "0.000030"\ncompletion = "0.000060"\ncached_prompt = "0.0000031"'),
      ).join(),
    ).toContain('cached_prompt')
  })
})
