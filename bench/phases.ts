import type { FleetSpec } from './fleet.ts'
import { chatBody, runLoad } from './load.ts'
import { log } from './log.ts'
import { memoryOf, WANTED_FDS } from './proc.ts'
import type { ContestantResult, MemoryLevel, StepResult, StreamResult } from './report.ts'
import { holdStreams } from './streams.ts'
import { type Contestant, type ContestantName, LABELS } from './targets.ts'

/**
 * The measurements of one contestant, in the order run.ts calls them, and the plan (durations,
 * rates, sizes) that differs between the full run and --quick.
 */

/** Everything that differs between the full run and --quick. */
export interface Plan {
  quick: boolean
  ladder: number[]
  fixedRates: number[]
  stepMs: number
  fixedStepMs: number
  warmupMs: number
  /** A fresh process's warm-up before the ladder: this long at warmRate, nothing recorded. */
  warmMs: number
  warmRate: number
  /** Streams through the contestant before the stream phase records, nothing recorded. */
  streamWarmMs: number
  drainMs: number
  pauseMs: number
  retry: boolean
  maxInFlight: number
  p99BoundMs: number
  wrkS: number
  wrkConnections: number
  streamMs: number
  streamConcurrency: number
  fleet: FleetSpec
  memoryLevels: number[]
  rampPerSec: number
  holdMs: number
  openTimeoutMs: number
  readyRuns: number
}

export function plan(quick: boolean, fds: number): { plan: Plan; memoryNote: string } {
  // A proxy holds two sockets per stream (client and upstream); keep clear of the fd limit.
  const fdCap = Math.floor((fds - 128) / 2 / 100) * 100
  const wantedMax = quick ? 300 : 10_000
  const top = Math.min(wantedMax, fdCap)
  const memoryNote =
    top < wantedMax
      ? `Asked for ${wantedMax.toLocaleString('en-US')} streams; ran ${top.toLocaleString('en-US')}: the open-files hard limit here is ${fds.toLocaleString('en-US')} and a proxy holds two sockets per stream (\`ulimit -n ${WANTED_FDS}\` is not permitted).`
      : ''
  const fixedRates = [500, 2000, 5000]
  const common = { fixedRates, maxInFlight: 2048, p99BoundMs: 50, wrkConnections: 64 }
  if (quick)
    return {
      memoryNote,
      plan: {
        ...common,
        quick,
        ladder: fixedRates,
        stepMs: 800,
        fixedStepMs: 800,
        warmupMs: 200,
        warmMs: 300,
        warmRate: 300,
        streamWarmMs: 300,
        drainMs: 1500,
        pauseMs: 100,
        // A second chance here too: on a busy 2-core machine one 800 ms step can miss by a single
        // pause, and a ladder stopped at its first step leaves the report's ratios without figures.
        retry: true,
        wrkS: 1,
        streamMs: 1000,
        streamConcurrency: 4,
        fleet: { nodesPerFleet: 3, streamItlMs: 5, holdItlMs: 100 },
        memoryLevels: [100, top],
        rampPerSec: 2000,
        holdMs: 200,
        openTimeoutMs: 5000,
        readyRuns: 1,
      },
    }
  return {
    memoryNote,
    plan: {
      ...common,
      quick,
      ladder: [500, 1000, 2000, 3000, 4000, 5000, 6000, 8000, 10_000, 12_000, 15_000],
      stepMs: 4000,
      fixedStepMs: 6000,
      warmupMs: 1000,
      // Long enough for JavaScriptCore to finish compiling a large program's hot paths: Tropa's JIT
      // thread still compiled 300 ms of CPU during a 2,000 RPS step that followed the old 600-request
      // warm-up, and under 20 ms a step after about 30,000 requests (bench/results/2026-11-28m).
      // The same for every contestant.
      warmMs: 20_000,
      warmRate: 1500,
      // The stream path (the SSE relay) is compiled only once streams flow: 10 s of them first.
      streamWarmMs: 10_000,
      drainMs: 3000,
      pauseMs: 300,
      retry: true,
      wrkS: 5,
      streamMs: 10_000,
      streamConcurrency: 8,
      fleet: { nodesPerFleet: 3, streamItlMs: 5, holdItlMs: 1000 },
      memoryLevels: [1000, top],
      rampPerSec: 2000,
      holdMs: 2000,
      openTimeoutMs: 20_000,
      readyRuns: 5,
    },
  }
}

/** A seed for which the simulator writes its longest answer (64 tokens), for long streams. */
export async function longestSeed(fastNode: string): Promise<number> {
  let best = { seed: 0, tokens: 0 }
  for (let seed = 0; seed < 300 && best.tokens < 64; seed++) {
    const res = await fetch(`${fastNode}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: chatBody('chat-small', { stream: false, maxTokens: 64, seed }),
    })
    const j = (await res.json()) as { usage?: { completion_tokens?: number } }
    const n = j.usage?.completion_tokens ?? 0
    if (n > best.tokens) best = { seed, tokens: n }
  }
  return best.seed
}

/**
 * The open-loop ladder on the fast fleet: each rate in turn until one is not held (p99 over the
 * bound, errors, or requests left unanswered). `rates` defaults to the plan's ladder.
 */
export async function runLadder(
  c: Contestant,
  p: Plan,
  rates: readonly number[] = p.ladder,
): Promise<{ steps: StepResult[]; max: number | null; top: boolean }> {
  const ep = c.endpoint('fast')
  const body = chatBody(c.model('fast'), { stream: false, maxTokens: 16, seed: 1 })
  // Warm-up: JIT, connection pools, the tokenizer, before anything is recorded.
  await runLoad(ep, body, {
    stream: false,
    warmupMs: p.warmMs,
    drainMs: p.drainMs,
    open: { rate: p.warmRate, durationMs: p.warmMs, maxInFlight: p.maxInFlight },
  })
  const steps: StepResult[] = []
  let max: number | null = null
  let retried = false
  for (const rate of rates) {
    const durationMs = p.fixedRates.includes(rate) ? p.fixedStepMs : p.stepMs
    let held = false
    for (let attempt = 1; ; attempt++) {
      const r = await runLoad(ep, body, {
        stream: false,
        warmupMs: p.warmupMs,
        drainMs: p.drainMs,
        open: { rate, durationMs, maxInFlight: p.maxInFlight },
      })
      const expected = (rate * (durationMs - p.warmupMs)) / 1000
      held =
        r.errors === 0 && r.unfinished === 0 && r.total.count >= expected * 0.98 && r.total.p99 < p.p99BoundMs
      steps.push({
        rate,
        held,
        attempt,
        ok: r.ok,
        errors: r.errors,
        unfinished: r.unfinished,
        achievedRps: r.achievedRps,
        maxSendLagMs: r.maxSendLagMs,
        total: r.total,
        ttfb: r.ttfb,
        errorSamples: r.errorSamples,
      })
      log(
        `  ${c.name} ${rate} RPS #${attempt}: ${held ? 'held' : 'NOT held'} p50 ${r.total.p50.toFixed(2)} p99 ${r.total.p99.toFixed(2)} p99.9 ${r.total.p999.toFixed(2)} ms, ${r.errors + r.unfinished} errors${r.errorSamples.length ? ` (${r.errorSamples[0]})` : ''}`,
      )
      await Bun.sleep(p.pauseMs)
      // One second chance per contestant: a single GC pause on a 2-core box should not end the ladder.
      if (held || !p.retry || retried) break
      retried = true
    }
    if (!held) return { steps, max, top: false }
    max = rate
  }
  return { steps, max, top: true }
}

/**
 * Streams through the contestant and, at the same time, the same number straight to the fleet:
 * the comparison is paired in time, so machine noise (other processes, timer jitter) hits both
 * sides alike instead of landing in the difference. For direct itself the two groups are an A/A
 * test: their difference is the resolution of "added".
 */
export async function runStream(
  c: Contestant,
  direct: Contestant,
  p: Plan,
  seed: number,
): Promise<StreamResult> {
  const opts = {
    stream: true,
    warmupMs: Math.min(1000, p.streamMs / 4),
    drainMs: p.drainMs,
    closed: { concurrency: p.streamConcurrency, durationMs: p.streamMs },
  }
  const body = (x: Contestant) => chatBody(x.model('stream'), { stream: true, maxTokens: 64, seed })
  // Warm-up as measured, both groups, nothing kept: the relay's code compiled, the pools open.
  const warm = { ...opts, warmupMs: 0, closed: { ...opts.closed, durationMs: p.streamWarmMs } }
  await Promise.all([
    runLoad(c.endpoint('stream'), body(c), warm),
    runLoad(direct.endpoint('stream'), body(direct), warm),
  ])
  const [r, ref] = await Promise.all([
    runLoad(c.endpoint('stream'), body(c), opts),
    runLoad(direct.endpoint('stream'), body(direct), opts),
  ])
  return {
    concurrency: p.streamConcurrency,
    ok: r.ok,
    errors: r.errors + r.unfinished,
    errorSamples: r.errorSamples,
    ttft: r.ttft,
    itl: r.itl,
    addedGap: r.addedGap,
    total: r.total,
    reference: { ttft: ref.ttft, itl: ref.itl, total: ref.total, addedGap: ref.addedGap },
  }
}

/** Resident memory of a fresh, warmed process at each level of concurrent open streams. */
export async function runMemory(
  c: Contestant,
  p: Plan,
  seed: number,
): Promise<{ idle: number | null; levels: MemoryLevel[] }> {
  // Load everything lazy (tokenizer, pools) so that "before" is a warm, idle process.
  const fast = chatBody(c.model('fast'), { stream: false, maxTokens: 16, seed: 1 })
  await runLoad(c.endpoint('fast'), fast, {
    stream: false,
    warmupMs: 0,
    drainMs: p.drainMs,
    closed: { concurrency: 4, durationMs: 300 },
  })
  await Bun.sleep(300)
  const idle = memoryOf(c.pid)?.rssKiB ?? null
  const body = chatBody(c.model('hold'), { stream: true, maxTokens: 64, seed })
  const levels: MemoryLevel[] = []
  for (const n of p.memoryLevels) {
    const r = await holdStreams(c.endpoint('hold'), body, {
      n,
      rampPerSec: p.rampPerSec,
      openTimeoutMs: p.openTimeoutMs,
      holdMs: p.holdMs,
      pid: c.pid,
      sampleEveryMs: 50,
    })
    const before = r.before?.rssKiB ?? 0
    levels.push({
      streams: n,
      opened: r.opened,
      failed: r.failed,
      beforeKiB: before,
      peakRssKiB: r.peakRssKiB,
      hwmKiB: r.hwmKiB,
      perStreamKiB: r.opened > 0 ? (r.peakRssKiB - before) / r.opened : 0,
      openMs: r.openMs,
      errorSamples: r.errorSamples,
    })
    log(
      `  ${c.name} ${n} streams: ${r.opened} open in ${(r.openMs / 1000).toFixed(1)} s, RSS ${(before / 1024).toFixed(1)} -> ${(r.peakRssKiB / 1024).toFixed(1)} MiB${r.failed ? `, ${r.failed} failed (${r.errorSamples[0]})` : ''}`,
    )
    // Let cancelled streams unwind on both sides before the next level.
    await Bun.sleep(p.quick ? 200 : 1500)
  }
  return { idle, levels }
}

export function emptyResult(name: ContestantName): ContestantResult {
  return {
    name,
    label: LABELS[name],
    available: true,
    notes: [],
    steps: [],
    maxHeldRps: null,
    maxHeldIsLadderTop: false,
    wrk: null,
    stream: null,
    memory: [],
    idleRssKiB: null,
  }
}
