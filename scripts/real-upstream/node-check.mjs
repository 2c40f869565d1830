// node-check.mjs: the same model through node-llama-cpp under Node (not Bun), to compare.
//   node scripts/real-upstream/node-check.mjs [--model .real-upstream/tiny.gguf] [--threads 1]
import { dirname, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const repo = resolve(here, '..', '..')
const argv = process.argv.slice(2)
const arg = (n, d) => (argv.includes(`--${n}`) ? argv[argv.indexOf(`--${n}`) + 1] : d)
const dir = process.env.REAL_UPSTREAM_DIR ?? resolve(repo, '.real-upstream')
const modelPath = resolve(arg('model', resolve(dir, 'tiny.gguf')))
const threads = Number(arg('threads', '1'))
const lib = process.env.NODE_LLAMA_CPP_DIR ?? resolve(dir, 'node_modules/node-llama-cpp')

const t0 = performance.now()
const nlc = await import(pathToFileURL(resolve(lib, 'dist/index.js')).href)
const llama = await nlc.getLlama({ gpu: false, build: 'never', logLevel: nlc.LlamaLogLevel.warn })
const model = await llama.loadModel({ modelPath, gpuLayers: 0 })
const ctx = await model.createContext({ contextSize: 2048, sequences: 1, threads })
const loadMs = performance.now() - t0
const prompt = [model.tokens.bos, ...model.tokenize('user: Say hi to the router\nassistant:')]
const seq = ctx.getSequence()
const s = performance.now()
let first = 0
let n = 0
for await (const _token of seq.evaluate(prompt, { temperature: 1, seed: 1 })) {
  if (n === 0) first = performance.now() - s
  if (++n >= 200) break
}
const total = performance.now() - s
console.log(
  `${typeof Bun === 'undefined' ? `node ${process.version}` : `bun ${Bun.version}`}: load ${loadMs.toFixed(0)} ms, prompt ${prompt.length} tokens, first token ${first.toFixed(1)} ms, ` +
    `${n} tokens in ${total.toFixed(1)} ms, ${((total - first) / (n - 1)).toFixed(2)} ms/token after the first (threads ${threads})`,
)
await ctx.dispose()
await model.dispose()
await llama.dispose()
