import { parseArgs } from 'node:util'
import { startSimFleet } from './index.ts'
import { PROTOCOLS, type SimProtocol } from './protocols/index.ts'

const HELP = `tropa sim: simulated OpenAI-compatible inference nodes (continuous batching, prefix cache)

Flags:
  --nodes <n>          how many nodes (default 3)
  --port <p>           first port; node i listens on p+i (default 9101)
  --itl-ms <ms>        inter-token latency (default 20)
  --prefill-tps <n>    prefill tokens per second (default 8000)
  --max-seqs <n>       running sequences at most (default 32)
  --time-scale <x>     multiply every delay (0: answer at once; default 1)
  --protocol <p>       the API the nodes speak: openai (default), or a provider's own
                       (src/simulator/protocols/)
  --token-lifetime-ms <ms>  how long issued access tokens live (gigachat; default 1800000)`

/** `tropa sim`: runs nodes until SIGINT or SIGTERM. */
export async function runSimCommand(argv: string[]): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: {
      nodes: { type: 'string' },
      port: { type: 'string' },
      'itl-ms': { type: 'string' },
      'prefill-tps': { type: 'string' },
      'max-seqs': { type: 'string' },
      'time-scale': { type: 'string' },
      protocol: { type: 'string' },
      'token-lifetime-ms': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  })
  if (values.help) return void console.log(HELP)
  const num = (v: string | undefined, d: number) => (v === undefined ? d : Number(v))
  const n = num(values.nodes, 3)
  const protocol = (values.protocol ?? 'openai') as SimProtocol
  if (protocol !== 'openai' && !PROTOCOLS[protocol])
    throw new Error(`--protocol ${protocol}: one of openai, ${Object.keys(PROTOCOLS).join(', ')}`)
  const port = num(values.port, 9101)
  const fleet = await startSimFleet(
    Array.from({ length: n }, (_, i) => ({
      name: `sim-${i + 1}`,
      port: port + i,
      itlMs: num(values['itl-ms'], 20),
      prefillTokensPerSec: num(values['prefill-tps'], 8000),
      maxSeqs: num(values['max-seqs'], 32),
      timeScale: num(values['time-scale'], 1),
      seed: i,
      protocol,
      tokenLifetimeMs: num(values['token-lifetime-ms'], 30 * 60_000),
    })),
  )
  for (const node of fleet.nodes) console.log(`${node.name} ${node.url}`)
  const stop = async () => {
    await fleet.stop()
    process.exit(0)
  }
  process.on('SIGINT', stop)
  process.on('SIGTERM', stop)
}
