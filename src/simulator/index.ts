import { type SimNode, type SimNodeOptions, startSimNode } from './node.ts'

export {
  Engine,
  type EngineEvent,
  type EngineParams,
  type EngineRequest,
  promptBlockHashes,
} from './engine.ts'
export { type SimFaults, type SimNode, type SimNodeOptions, type SimNodeStats, startSimNode } from './node.ts'

/** Several simulated nodes in this process, each on its own port. */
export async function startSimFleet(
  opts: SimNodeOptions[],
): Promise<{ nodes: SimNode[]; stop(): Promise<void> }> {
  const nodes = await Promise.all(opts.map((o) => startSimNode(o)))
  return {
    nodes,
    async stop() {
      await Promise.all(nodes.map((n) => n.stop()))
    },
  }
}
