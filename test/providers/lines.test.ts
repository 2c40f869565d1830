import { describe, expect, test } from 'bun:test'
import { UpstreamFailed } from '../../src/errors.ts'
import { lineSplitter } from '../../src/upstream/providers/lines.ts'

const enc = new TextEncoder()
async function lines(parts: Uint8Array[], max?: number): Promise<string[]> {
  const source = new ReadableStream<Uint8Array>({
    start(c) {
      for (const p of parts) c.enqueue(p)
      c.close()
    },
  })
  const out: string[] = []
  for await (const l of source.pipeThrough(lineSplitter('node', max))) out.push(l)
  return out
}

describe('the line splitter of translated streams', () => {
  test('LF and CRLF lines split across chunks, multi-byte characters split across chunks, a last line without newline', async () => {
    const bytes = enc.encode('data: {"a":"привет"}\r\n\r\ndata: [DONE]\nлишнее')
    const parts = [bytes.slice(0, 13), bytes.slice(13, 21), bytes.slice(21)]
    expect(await lines(parts)).toEqual(['data: {"a":"привет"}', '', 'data: [DONE]', 'лишнее'])
  })

  test('a line over the bound fails the stream (UpstreamFailed) instead of buffering without end', async () => {
    const chunk = enc.encode('x'.repeat(64 * 1024))
    const err = await lines(
      Array.from({ length: 20 }, () => chunk),
      1 << 20,
    ).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(UpstreamFailed)
    expect((err as Error).message).toContain('over 1048576 characters')
  })
})
