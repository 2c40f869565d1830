import type OpenAI from 'openai'
import { toFile } from 'openai'

/**
 * Uploads `n` chat lines (`<prefix>-0` ... `<prefix>-<n-1>`, `maxTokens` out each, 16 by default;
 * the user message `line <i>` unless `content` says otherwise) and starts them as a batch.
 */
export async function startChatBatch(
  client: OpenAI,
  n: number,
  {
    maxTokens = 16,
    prefix = 'id',
    content = (i) => `line ${i}`,
  }: { maxTokens?: number; prefix?: string; content?: (i: number) => string } = {},
) {
  const rows = Array.from({ length: n }, (_, i) =>
    JSON.stringify({
      custom_id: `${prefix}-${i}`,
      method: 'POST',
      url: '/v1/chat/completions',
      body: { model: 'test/chat', messages: [{ role: 'user', content: content(i) }], max_tokens: maxTokens },
    }),
  )
  const file = await client.files.create({
    file: await toFile(Buffer.from(`${rows.join('\n')}\n`), 'lines.jsonl'),
    purpose: 'batch',
  })
  return client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
  })
}

/** Polls a batch every 20 ms until at least `target` lines completed or `tries` polls; returns the count. */
export async function waitForCompleted(client: OpenAI, batchId: string, target: number, tries: number) {
  let seen = 0
  for (let i = 0; i < tries && seen < target; i++) {
    await Bun.sleep(20)
    seen = (await client.batches.retrieve(batchId)).request_counts?.completed ?? 0
  }
  return seen
}
