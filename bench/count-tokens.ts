/**
 * `bun bench/count-tokens.ts [--ascii] [<tree> ...]`: counting prompts' tokens in process, each source tree
 * in its own process (default: this one), and what the counting leaves JavaScriptCore's next young
 * collection. 64 prompts of about 16 KB (English and Russian words, or with `--ascii` English alone; one in ten with a number),
 * 200 counted to warm up; then 7 rounds of 300 counts, each after a full collection, timed, and a
 * young collection timed after each round. Prints the medians. Issue #24: the tokenizer's cache
 * on the request path (bench/results/2026-11-28f-request-path-cpu.md).
 */
import { resolve } from 'node:path'

const CHILD = 'COUNT_TOKENS_TREE'

async function child(tree: string) {
  const { edenGC, fullGC } = await import('bun:jsc')
  const t = (await import(`${tree}/src/tokenizer.ts`)) as typeof import('../src/tokenizer.ts')
  await t.loadTokenizer()
  const words = (
    'the router sends each request to the node predicted to answer first, counting queued prompt ' +
    (process.env.COUNT_TOKENS_ASCII
      ? 'tokens and cached prefixes; batch lines go into the valleys of the load, while requests wait'
      : 'tokens and cached prefixes; батч строки уходят в долины нагрузки, пока интерактивные запросы ждут')
  ).split(' ')
  let seed = 1
  const rnd = () => {
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed / 2147483648
  }
  const texts = Array.from({ length: 64 }, () =>
    Array.from(
      { length: 2500 },
      () => words[Math.floor(rnd() * words.length)]! + (rnd() < 0.1 ? `${Math.floor(rnd() * 1e5)}` : ''),
    ).join(' '),
  )
  for (let i = 0; i < 200; i++) t.countTokens(texts[i % 64]!)
  const counts: number[] = []
  const edens: number[] = []
  for (let r = 0; r < 7; r++) {
    fullGC()
    edenGC()
    const a = performance.now()
    for (let i = 0; i < 300; i++) t.countTokens(texts[i % 64]!)
    counts.push((performance.now() - a) / 300)
    const b = performance.now()
    edenGC()
    edens.push(performance.now() - b)
  }
  const median = (x: number[]) => [...x].sort((p, q) => p - q)[x.length >> 1]!
  console.log(
    `${tree}: ${median(counts).toFixed(3)} ms a prompt (${t.countTokens(texts[0]!)} tokens the first); young collection after 300: ${median(edens).toFixed(2)} ms`,
  )
}

if (process.env[CHILD]) await child(process.env[CHILD])
else {
  const args = process.argv.slice(2)
  const ascii = args.includes('--ascii')
  const trees = args.filter((a) => a !== '--ascii')
  for (const tree of (trees.length > 0 ? trees : ['.']).map((t) => resolve(t))) {
    const p = Bun.spawn([process.execPath, import.meta.path], {
      env: { ...process.env, [CHILD]: tree, ...(ascii && { COUNT_TOKENS_ASCII: '1' }) },
      stdio: ['ignore', 'inherit', 'inherit'],
    })
    await p.exited
  }
}
