import { expect, test } from 'bun:test'
import { cleanUpstreamMessage, cleanUpstreamParam, MAX_MESSAGE } from '../../src/upstream/redact.ts'

test('credentials are stripped from an upstream message', () => {
  const cases: [string, string[]][] = [
    ['Incorrect API key provided: sk-proj-abcDEF1234567890xyzXYZ.', ['sk-', 'abcDEF1234567890']],
    ['Authorization: Bearer abc.def-123 was refused', ['abc.def-123']],
    ['retry with api_key=AIzaSyD-abc123 or token: "t0k3n-value"', ['AIzaSyD', 't0k3n']],
    ['GET http://admin:hunter2@10.0.0.5:8000/v1/x?key=k3y&x=1 failed', ['hunter2', 'k3y']],
    ['jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig rejected', ['eyJ']],
    ['trace 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', ['9f86d0']],
    ['blob QWxhZGRpbjpvcGVuIHNlc2FtZTEyMzQ1Njc4OTA= here', ['QWxhZGRpbjpv']],
    ['keys ghp_abcdefghijklmnop1234 AKIAIOSFODNN7EXAMPLE xoxb-1234-abcd', ['ghp_', 'AKIA', 'xoxb']],
  ]
  for (const [message, secrets] of cases) {
    const cleaned = cleanUpstreamMessage(message)
    expect(cleaned).toContain('[redacted]')
    for (const s of secrets) expect(cleaned).not.toContain(s)
  }
})

test('filesystem paths are stripped; the meaning stays', () => {
  expect(cleanUpstreamMessage("No such file or directory: '/srv/models/llama/config.json'")).toBe(
    "No such file or directory: '[path]'",
  )
  expect(cleanUpstreamMessage('failed to open C:\\Users\\admin\\key.txt')).toBe('failed to open [path]')
  expect(cleanUpstreamMessage('share \\\\fileserver\\models\\a.bin gone')).toBe('share [path] gone')
  expect(cleanUpstreamMessage('see ~/secrets/x and ./conf/y and /srv')).toBe(
    'see [path] and [path] and [path]',
  )
  const ordinary = [
    "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.",
    'model Qwen2.5-Coder-32B-Instruct-GPTQ-Int4 does not support tools; meta-llama/Llama-3.1-8B-Instruct does',
    'messages[0].content must be a string; max_tokens: 4096 at most; see https://platform.openai.com/docs',
  ]
  for (const m of ordinary) expect(cleanUpstreamMessage(m)).toBe(m)
})

test('one bounded line', () => {
  const long = cleanUpstreamMessage(`a\nb\r\n\u0000c ${'x '.repeat(10_000)}`)
  expect(long.startsWith('a b c x')).toBe(true)
  expect(long.length).toBeLessThanOrEqual(MAX_MESSAGE)
  expect(cleanUpstreamMessage('')).toBe('no message')
  expect(cleanUpstreamParam('messages[0].content')).toBe('messages[0].content')
  expect(cleanUpstreamParam('/srv/x')).toBeNull()
  expect(cleanUpstreamParam(7)).toBeNull()
})
