import type { SimNodeOptions, SimNodeStats } from '../../src/simulator/index.ts'

/**
 * Simulated nodes in a child process, so a test that makes them work hard (long fast streams)
 * measures the router rather than its own event loop. The child prints one JSON line with the
 * nodes' URLs and a control URL whose GET answers every node's stats.
 */
export async function startSimProcess(opts: SimNodeOptions[]) {
  const proc = Bun.spawn([process.execPath, import.meta.path, JSON.stringify(opts)], {
    stdout: 'pipe',
    stderr: 'inherit',
  })
  const reader = proc.stdout.getReader()
  let line = ''
  while (!line.includes('\n')) {
    const { done, value } = await reader.read()
    if (done) throw new Error('the simulator process exited before it listened')
    line += new TextDecoder().decode(value)
  }
  reader.releaseLock()
  const info = JSON.parse(line) as { control: string; nodes: { name: string; url: string }[] }
  return {
    nodes: info.nodes,
    pid: proc.pid,
    /** Every node's stats, summed. */
    async stats(): Promise<SimNodeStats> {
      const all = (await (await fetch(info.control)).json()) as SimNodeStats[]
      const sum = { ...all[0]! }
      for (const s of all.slice(1)) for (const k of Object.keys(sum) as (keyof SimNodeStats)[]) sum[k] += s[k]
      return sum
    },
    async stop() {
      proc.kill('SIGKILL')
      await proc.exited
    },
  }
}

if (import.meta.main) {
  const { startSimFleet } = await import('../../src/simulator/index.ts')
  const fleet = await startSimFleet(JSON.parse(process.argv[2]!) as SimNodeOptions[])
  const control = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    fetch: () => Response.json(fleet.nodes.map((n) => n.stats())),
  })
  console.log(
    JSON.stringify({
      control: `http://127.0.0.1:${control.port}/`,
      nodes: fleet.nodes.map((n) => ({ name: n.name, url: n.url })),
    }),
  )
}
