import { expect, test } from 'bun:test'
import { InsufficientStorage, isDiskFull } from '../../src/errors.ts'
import { contentDisposition, sanitizeFilename } from '../../src/files/names.ts'

test('sanitizeFilename: controls, bidi marks, paths, length, empty', () => {
  expect(sanitizeFilename('a\r\nb\u0000\u007f\u0085.jsonl')).toBe('ab.jsonl')
  expect(sanitizeFilename('invoice\u202Elnosj.exe')).toBe('invoicelnosj.exe')
  expect(sanitizeFilename('../../etc/passwd')).toBe('passwd')
  expect(sanitizeFilename('C:\\temp\\x.jsonl')).toBe('x.jsonl')
  expect(sanitizeFilename('dir/')).toBe('upload.jsonl')
  expect(sanitizeFilename('..')).toBe('upload.jsonl')
  expect(sanitizeFilename(undefined)).toBe('upload.jsonl')
  expect(sanitizeFilename('\ud800x.jsonl')).toBe('\ufffdx.jsonl') // a lone surrogate
  const long = sanitizeFilename('😀'.repeat(100)) // 4 bytes each
  expect(long).toBe('😀'.repeat(63))
  expect(sanitizeFilename('e\u0301.jsonl')).toBe('\u00e9.jsonl') // NFC
})

test('contentDisposition: ASCII fallback plus RFC 8187 filename*, safe for any stored name', () => {
  expect(contentDisposition('a.jsonl')).toBe(`attachment; filename="a.jsonl"; filename*=UTF-8''a.jsonl`)
  expect(contentDisposition('a"b\\c%d.jsonl')).toBe(
    `attachment; filename="a_b_c_d.jsonl"; filename*=UTF-8''a%22b%5Cc%25d.jsonl`,
  )
  expect(contentDisposition("it's (1)*.jsonl")).toBe(
    `attachment; filename="it's (1)*.jsonl"; filename*=UTF-8''it%27s%20%281%29%2A.jsonl`,
  )
  const legacy = contentDisposition('a\r\nb.jsonl')
  expect(legacy).toBe(`attachment; filename="ab.jsonl"; filename*=UTF-8''ab.jsonl`)
  expect(() => new Headers({ 'content-disposition': contentDisposition('\ud800\r\n\u0000ж') })).not.toThrow()
})

test('isDiskFull: OS, SQLite, PostgreSQL, wrapped, across threads as text', () => {
  const errno = (code: string) => Object.assign(new Error(`${code}: x`), { code })
  expect(isDiskFull(errno('ENOSPC'))).toBe(true)
  expect(isDiskFull(errno('EDQUOT'))).toBe(true)
  expect(isDiskFull(Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' }))).toBe(true)
  expect(isDiskFull(Object.assign(new Error('could not extend file'), { code: '53100' }))).toBe(true)
  expect(isDiskFull(new Error('query failed', { cause: errno('ENOSPC') }))).toBe(true)
  expect(isDiskFull('Error: SQLiteError: database or disk is full')).toBe(true)
  expect(isDiskFull(String(new InsufficientStorage('the file').stack))).toBe(true)
  expect(isDiskFull(errno('EACCES'))).toBe(false)
  expect(isDiskFull(new Error('boom'))).toBe(false)
  expect(isDiskFull(undefined)).toBe(false)
})
