#!/usr/bin/env bun
/**
 * Issue #24: which closures, scopes and objects an open stream keeps. Reads a heap snapshot in
 * V8's format (`bun bench/heap-census.ts 1000 --snapshot` writes one with 1,000 streams open) and
 * prints, for every kind of node that numbers at least `--per` times the streams (default 0.9 x
 * N): its count and bytes over the streams (the idle process's own nodes included: a kind that
 * reads 1.00 is one a stream, one that reads 2.92 is mostly not); then the lexical scopes by the
 * names of their variables, and the closures by their scope's variables, the same way.
 *
 * bun bench/heap-scopes.ts <file.heapsnapshot> [--streams 1000] [--per 0.9]
 */
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'

interface Snapshot {
  snapshot: {
    meta: { node_fields: string[]; node_types: [string[]]; edge_fields: string[]; edge_types: [string[]] }
  }
  nodes: number[]
  edges: number[]
  strings: string[]
}

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { streams: { type: 'string' }, per: { type: 'string' } },
})
const file = positionals[0]
if (!file) throw new Error('usage: bun bench/heap-scopes.ts <file.heapsnapshot> [--streams N] [--per F]')
const streams = Number(values.streams ?? 1000)
const floor = Number(values.per ?? 0.9) * streams
let parsed: unknown = JSON.parse(readFileSync(file, 'utf8'))
// Bun.generateHeapSnapshot('v8') returns a string; heap-hook.ts writes it JSON-encoded.
if (typeof parsed === 'string') parsed = JSON.parse(parsed)
const s = parsed as Snapshot
const { node_fields: nf, node_types, edge_fields: ef, edge_types } = s.snapshot.meta
const N = nf.length
const E = ef.length
const [TYPE, NAME, SIZE, EDGES] = ['type', 'name', 'self_size', 'edge_count'].map((f) => nf.indexOf(f)) as [
  number,
  number,
  number,
  number,
]
const [ETYPE, ENAME, ETO] = ['type', 'name_or_index', 'to_node'].map((f) => ef.indexOf(f)) as [
  number,
  number,
  number,
]
const count = s.nodes.length / N
const firstEdge = new Int32Array(count)
for (let i = 0, at = 0; i < count; i++) {
  firstEdge[i] = at
  at += s.nodes[i * N + EDGES]!
}
const typeOf = (i: number) => node_types[0][s.nodes[i * N + TYPE]!]!
const nameOf = (i: number) => s.strings[s.nodes[i * N + NAME]!]!
const isScope = (i: number) => nameOf(i).includes('JSLexicalEnvironment')
/** A scope's variables (its `context` edges), sorted. */
function variables(i: number): string {
  const out: string[] = []
  for (let k = firstEdge[i]!; k < firstEdge[i]! + s.nodes[i * N + EDGES]!; k++)
    if (edge_types[0][s.edges[k * E + ETYPE]!] === 'context') out.push(s.strings[s.edges[k * E + ENAME]!]!)
  return out.sort().join(' ')
}
/** The scope a closure closes over (its first internal edge to one). */
function scopeOf(i: number): number | undefined {
  for (let k = firstEdge[i]!; k < firstEdge[i]! + s.nodes[i * N + EDGES]!; k++) {
    const to = s.edges[k * E + ETO]! / N
    if (edge_types[0][s.edges[k * E + ETYPE]!] === 'internal' && isScope(to)) return to
  }
  return undefined
}

const kinds = new Map<string, { n: number; bytes: number }>()
const scopes = new Map<string, number>()
const closures = new Map<string, number>()
for (let i = 0; i < count; i++) {
  const key = `${typeOf(i)} ${nameOf(i).slice(0, 60)}`
  const k = kinds.get(key) ?? { n: 0, bytes: 0 }
  k.n++
  k.bytes += s.nodes[i * N + SIZE]!
  kinds.set(key, k)
  if (isScope(i)) {
    const v = variables(i)
    scopes.set(v, (scopes.get(v) ?? 0) + 1)
  } else if (typeOf(i) === 'closure') {
    const scope = scopeOf(i)
    const v = `${nameOf(i)} (${scope === undefined ? '' : variables(scope)})`
    closures.set(v, (closures.get(v) ?? 0) + 1)
  }
}
const rows = (m: Map<string, number>) => [...m].filter(([, n]) => n >= floor).sort((a, b) => b[1] - a[1])
console.log(`nodes numbering at least ${floor} (per stream, bytes per stream):`)
for (const [k, v] of [...kinds].filter(([, v]) => v.n >= floor).sort((a, b) => b[1].bytes - a[1].bytes))
  console.log(
    `  ${(v.n / streams).toFixed(2).padStart(6)}  ${(v.bytes / streams).toFixed(0).padStart(6)} B  ${k}`,
  )
console.log('scopes, by their variables:')
for (const [k, n] of rows(scopes)) console.log(`  ${(n / streams).toFixed(2).padStart(6)}  ${k}`)
console.log('closures, by their scope:')
for (const [k, n] of rows(closures)) console.log(`  ${(n / streams).toFixed(2).padStart(6)}  ${k}`)
