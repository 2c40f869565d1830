/// <reference lib="webworker" />
// Entry point of a batch worker thread (a second entry of the compiled executable). It validates
// batch files, runs leased lines against the upstream the main thread picked, and writes result
// files. Money and routing stay on the main thread: every line asks it for a node and a
// reservation first, so the hard limits hold across threads.

import type { ResponsesRequest } from '../api/responses.ts'
import { batchCostNano, costNano } from '../billing/money.ts'
import type { ModelConfig } from '../config/load.ts'
import { UpstreamFailed, UpstreamRejected } from '../errors.ts'
import { LocalFileStore } from '../files/file-store.ts'
import { FilesService } from '../files/service.ts'
import { modelPattern } from '../identity/live.ts'
import { requestId, sortableId } from '../ids.ts'
import { type ChatCompletionJson, textCompletionOf } from '../pipeline/completions.ts'
import { countTokens, loadTokenizer } from '../pipeline/tokens.ts'
import { responseOfCompletion } from '../responses/translate.ts'
import { openStore } from '../storage/open.ts'
import type { BatchLine, BatchRecord, BatchStatus, FileRecord, Store } from '../storage/store.ts'
import { ProviderRegistry } from '../upstream/providers/index.ts'
import { estimatedUsage, sanitizePromptUsage, sanitizeUsage, type Usage } from '../upstream/sse.ts'
import { Watchdog } from '../upstream/watchdog.ts'
import type { AdmitReply, FromWorker, ToWorker, WorkerInit } from './protocol.ts'
import { endStamp } from './stamps.ts'
import { type LineCost, priceLine, validateFile } from './validate.ts'

declare const self: Worker
/** The `priority` of a batch line on a route with vLLM's priority scheduling: after everything else. */
const BATCH_PRIORITY = 100
let cfg: WorkerInit
let store: Store
let files: FilesService
let models: Map<string, ModelConfig>
/** The same provider adapters as the live path's. */
const providers = new ProviderRegistry(new Watchdog())
let stopping = false
let inFlight = 0
let nextReq = 0
const waiting = new Map<number, (r: AdmitReply) => void>()
/** Upstream calls under way, by the main thread's request number (to pre-empt them). */
const calls = new Map<number, AbortController>()

/** The main thread took the line's node back for interactive traffic. */
class Preempted extends Error {
  constructor() {
    super('pre-empted by interactive traffic')
  }
}
let markReady!: () => void
// Messages can arrive before the store and the tokenizer are open: every job waits for this.
const ready = new Promise<void>((resolve) => {
  markReady = resolve
})
const job = (batchId: string, f: () => Promise<void>) =>
  void ready.then(f).catch((err) => post({ t: 'error', batchId, message: String(err?.stack ?? err) }))

const post = (m: FromWorker) => self.postMessage(m)

self.onmessage = (ev: MessageEvent<ToWorker | { t: 'init'; init: WorkerInit }>) => {
  const m = ev.data
  switch (m.t) {
    case 'init':
      void start(m.init)
      break
    case 'validate':
      job(m.batchId, () => validate(m.batchId, m.keyModels))
      break
    case 'finalize':
      job(m.batchId, () => finalize(m.batchId, m.status))
      break
    case 'admitted':
      waiting.get(m.reqId)?.(m.reply)
      waiting.delete(m.reqId)
      break
    case 'preempt':
      calls.get(m.reqId)?.abort(new Preempted())
      break
    case 'stop':
      stopping = true
      break
    case 'models':
      models = new Map(m.models.map((x) => [x.id, x]))
      break
  }
}

async function start(i: WorkerInit) {
  cfg = i
  store = await openStore(cfg.storage, 'thread')
  files = new FilesService(store, new LocalFileStore(cfg.filesDir), { maxBytes: 0, maxLines: 0 })
  models = new Map(cfg.models.map((m) => [m.id, m]))
  await loadTokenizer()
  markReady()
  void pump()
}

let wakeUp: (() => void) | undefined
const wake = () => {
  wakeUp?.()
  wakeUp = undefined
}

/** Leases runnable lines whenever there is room, and runs them. */
async function pump() {
  while (!stopping) {
    if (unwritten.size > 0) await requeueUnwritten()
    const room = cfg.concurrency - inFlight
    let leased: BatchLine[] = []
    if (room > 0) {
      try {
        leased = await store.leaseLines(cfg.leaseMs, room)
      } catch (err) {
        post({ t: 'error', message: `lease failed: ${String(err)}` })
      }
    }
    for (const line of leased) {
      inFlight++
      void runLine(line)
        .catch((err) => post({ t: 'error', message: String(err?.stack ?? err) }))
        .finally(() => {
          inFlight--
          wake()
        })
    }
    // Sleep until a line finishes (room to lease again) or, when idle, poll for new work.
    await new Promise<void>((resolve) => {
      wakeUp = resolve
      setTimeout(resolve, leased.length > 0 ? 20 : 50)
    })
  }
}

function admit(m: Omit<Extract<FromWorker, { t: 'admit' }>, 't' | 'reqId'>): Promise<AdmitReply> {
  const reqId = ++nextReq
  return new Promise((resolve) => {
    waiting.set(reqId, resolve)
    post({ t: 'admit', reqId, ...m })
  }).then((reply) => Object.assign(reply as AdmitReply, { reqId }))
}

async function runLine(line: BatchLine) {
  const batch = await store.getBatch(line.batchId)
  if (!batch) return
  const body = JSON.parse(line.body) as Record<string, unknown>
  const cost = priceLine(batch.endpoint, body, models)
  const reply = (await admit({
    batchId: line.batchId,
    line: line.line,
    model: cost.model.id,
    promptTokens: cost.promptTokens,
    worstNano: cost.worstNano,
  })) as AdmitReply & { reqId: number }
  if (reply.kind !== 'go') {
    // No node had room, or the batch stopped: the line goes back, and this was no attempt.
    await store.retryLine(line.batchId, line.line, reply.kind === 'wait' ? reply.ms : 1000, true)
    return
  }
  // From here the main thread holds a node slot and money for this line: whatever happens,
  // exactly one settle goes back.
  let settle: Extract<FromWorker, { t: 'settle' }> = {
    t: 'settle',
    reqId: reply.reqId,
    usage: null,
    nodeOk: true,
    outcome: 'error',
  }
  // Registered before anything else is awaited, so a pre-emption can never miss the call.
  const controller = new AbortController()
  calls.set(reply.reqId, controller)
  try {
    settle = await callUpstream(line, batch, body, cost, reply, controller)
  } catch (err) {
    // Its result could not be written (the disk is full): the line goes back to the queue as soon
    // as the store takes writes again, instead of waiting for its lease to run out.
    unwritten.set(`${line.batchId}:${line.line}`, line)
    throw err
  } finally {
    calls.delete(reply.reqId)
    post(settle)
  }
}

/** Lines whose result or retry could not be written, to give back to the queue. */
const unwritten = new Map<string, BatchLine>()

async function requeueUnwritten() {
  for (const [k, l] of unwritten) {
    try {
      await store.retryLine(l.batchId, l.line, 0)
    } catch {
      return // still failing: next round
    }
    unwritten.delete(k)
  }
}

/** One line against the node the main thread chose; returns what to settle. */
async function callUpstream(
  line: BatchLine,
  batch: BatchRecord,
  body: Record<string, unknown>,
  cost: LineCost,
  reply: Extract<AdmitReply, { kind: 'go' }> & { reqId: number },
  controller: AbortController,
): Promise<Extract<FromWorker, { t: 'settle' }>> {
  const endpoint = batch.endpoint
  const modelId = cost.model.id
  const countedPrompt = cost.promptTokens
  const startedAtMs = Date.now()
  const reqId = reply.reqId
  const chat = endpoint !== '/v1/embeddings'
  // A /v1/completions line goes to /completions as it is where its model passes it through (as
  // live), else as the chat request it stands for.
  const path = cost.passThrough ? '/completions' : chat ? '/chat/completions' : '/embeddings'
  // A /v1/completions or /v1/responses line runs as the chat request it stands for.
  const sent = (cost.chatBody ?? body) as Record<string, unknown>
  const requestIdOfLine = `${line.batchId}-${line.line}`
  let status = 0
  let text = ''
  let rejected: UpstreamRejected | undefined
  let answeredAtMs = startedAtMs
  // Through the same provider adapters as live traffic, to the route the main thread chose:
  // headers within the first-byte timeout, then the body within the idle timeout.
  const route = cost.model.routes.find((r) => r.node === reply.node)
  let timer: ReturnType<typeof setTimeout> | undefined
  try {
    if (!route) throw new Error(`no route ${reply.node} for ${modelId}`)
    // The bound reserved for goes upstream, as on the live path (one effective output bound).
    const bounds =
      cost.maxOut === undefined
        ? {}
        : sent.max_completion_tokens != null
          ? { max_tokens: cost.maxOut, max_completion_tokens: cost.maxOut }
          : { max_tokens: cost.maxOut }
    const up = await providers.send(
      {
        route,
        path,
        body: JSON.stringify({
          ...sent,
          model: route.upstreamModel,
          stream: false,
          ...bounds,
          // vLLM's priority scheduling: lower runs first, interactive requests are 0.
          ...(route.priorityScheduling && { priority: BATCH_PRIORITY }),
        }),
        stream: false,
        traceparent: reply.traceparent,
      },
      controller,
      Date.now() + (route.firstByteTimeoutMs ?? cfg.firstByteTimeoutMs),
    )
    timer = setTimeout(() => controller.abort(), cfg.idleTimeoutMs)
    status = up.response.status
    text = await up.response.text()
    answeredAtMs = Date.now()
  } catch (err) {
    // UpstreamRejected: the upstream refused the request itself. Anything else is the node's
    // failure (unreachable, timed out, 5xx, the statuses that say the node failed).
    if (err instanceof UpstreamRejected) rejected = err
    status = err instanceof UpstreamFailed && err.upstreamStatus !== null ? err.upstreamStatus : 0
  } finally {
    clearTimeout(timer)
  }
  if (controller.signal.reason instanceof Preempted && !(status >= 200 && status < 300)) {
    // Whatever the node had done is dropped: the line goes back to the queue at once, as no
    // attempt (it was no fault of the node's), and is billed only for the run that completes.
    await store.retryLine(line.batchId, line.line, 0, true)
    return { t: 'settle', reqId, usage: null, nodeOk: true, outcome: 'preempted' }
  }
  if (status >= 200 && status < 300) {
    let parsed: { id?: unknown; model?: unknown; usage?: unknown; choices?: unknown } | null = null
    try {
      parsed = JSON.parse(text)
    } catch {}
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed))
      return transient(line, reqId, 'upstream sent a malformed body')
    if (chat) parsed.id = `${cost.passThrough ? 'cmpl' : 'chatcmpl'}-${requestId()}`
    parsed.model = modelId
    const reported = chat ? sanitizeUsage(parsed.usage) : sanitizePromptUsage(parsed.usage)
    const usage = {
      promptTokens: reported?.prompt_tokens ?? countedPrompt,
      completionTokens: reported?.completion_tokens ?? (chat ? countTokens(answerText(parsed)) : 0),
      cachedTokens: cachedTokensOf(reported),
      ttftMs: answeredAtMs - startedAtMs,
    }
    // The line shows the usage billed: the upstream's when sane, else Tropa's count, marked.
    if (!reported) {
      const e = estimatedUsage(usage.promptTokens, usage.completionTokens)
      parsed.usage = chat
        ? e
        : { prompt_tokens: e.prompt_tokens, total_tokens: e.total_tokens, estimated: true }
    }
    const result = JSON.stringify({
      id: `batch_req_${requestId()}`,
      custom_id: line.customId,
      response: {
        status_code: status,
        request_id: requestIdOfLine,
        body:
          endpoint === '/v1/completions' && !cost.passThrough
            ? textCompletionOf(parsed as ChatCompletionJson, `cmpl-${requestId()}`)
            : endpoint === '/v1/responses'
              ? responseOfCompletion(
                  {
                    id: `resp_${sortableId()}`,
                    createdAt: Math.floor(Date.now() / 1000),
                    model: modelId,
                    body: body as ResponsesRequest,
                    store: false,
                  },
                  parsed as { choices?: unknown; usage: Usage },
                )
              : parsed,
      },
      error: null,
    })
    // The ledger row goes in with the result, in one transaction, so a node killed right after
    // cannot leave the line done but unbilled; the main thread's settlement of the same row
    // (same request id) then only moves its in-memory spend and the reservation.
    const full = batchCostNano(
      costNano(usage.promptTokens, usage.completionTokens, cost.model.price, usage.cachedTokens ?? 0),
    )
    // biome-ignore lint/complexity/useMathMinMax: bigint, which Math.min does not take
    const charged = full > cost.worstNano ? cost.worstNano : full
    const outcome = reported ? 'ok' : 'ok:estimated'
    const fresh = await store.finishLine(line.batchId, line.line, true, result, {
      requestId: requestIdOfLine,
      kind: 'usage',
      orgId: batch.orgId,
      keyId: batch.keyId,
      model: modelId,
      node: reply.node,
      promptTokens: usage.promptTokens,
      completionTokens: usage.completionTokens,
      costNano: charged,
      batchId: line.batchId,
      startedAtMs,
      endedAtMs: Date.now(),
      outcome: charged < full ? `${outcome}:capped` : outcome,
      estimated: false,
      cachedTokens: usage.cachedTokens,
      ttftMs: usage.ttftMs,
      receiptKid: reply.receiptKid,
    })
    // A line already final (finished by a worker that died after writing) is not billed again.
    return {
      t: 'settle',
      reqId,
      usage: fresh ? usage : null,
      nodeOk: true,
      outcome: reported ? 'ok' : 'ok:estimated',
    }
  }
  if (rejected) {
    // The upstream refused the request itself: retrying elsewhere would not help. Its message
    // goes into the error file cleaned of credentials and paths (by the adapter), as on the live path.
    const errBody = {
      error: {
        message: rejected.message.replace(/^upstream rejected the request: /, ''),
        type: 'invalid_request_error',
        param: rejected.param,
        code: null,
      },
    }
    status = rejected.upstreamStatus
    await store.finishLine(
      line.batchId,
      line.line,
      false,
      JSON.stringify({
        id: `batch_req_${requestId()}`,
        custom_id: line.customId,
        response: { status_code: status, request_id: requestIdOfLine, body: errBody },
        error: { code: 'upstream_rejected', message: `the upstream answered ${status}` },
      }),
    )
    return { t: 'settle', reqId, usage: null, nodeOk: true, outcome: 'rejected' }
  }
  return transient(
    line,
    reqId,
    status === 0 ? 'upstream unreachable or timed out' : `upstream answered ${status}`,
  )
}

/** The generated text of a chat completion, to count when the upstream reports no usage. */
/** The upstream's cached prompt tokens when it reported them (the ledger checks the range). */
function cachedTokensOf(u: Usage | undefined): number | null {
  const n = u?.prompt_tokens_details?.cached_tokens
  return typeof n === 'number' ? n : null
}

function answerText(c: { choices?: unknown }): string {
  let text = ''
  for (const ch of Array.isArray(c.choices)
    ? (c.choices as { text?: unknown; message?: { content?: unknown; tool_calls?: unknown } }[])
    : []) {
    // a chat completion's message, or a passed-through text_completion's text
    if (typeof ch?.text === 'string') text += ch.text
    if (typeof ch?.message?.content === 'string') text += ch.message.content
    if (ch?.message?.tool_calls) text += JSON.stringify(ch.message.tool_calls)
  }
  return text
}

/** A node failure: back off and retry within the window, up to maxAttempts. */
async function transient(
  line: BatchLine,
  reqId: number,
  why: string,
): Promise<Extract<FromWorker, { t: 'settle' }>> {
  const settle = { t: 'settle', reqId, usage: null, nodeOk: false, outcome: 'upstream_error' } as const
  if (line.attempts < cfg.maxAttempts) {
    await store.retryLine(line.batchId, line.line, Math.min(30_000, 250 * 2 ** line.attempts))
    return settle
  }
  await store.finishLine(
    line.batchId,
    line.line,
    false,
    JSON.stringify({
      id: `batch_req_${requestId()}`,
      custom_id: line.customId,
      response: null,
      error: { code: 'upstream_error', message: why },
    }),
  )
  return settle
}

async function validate(batchId: string, keyModels: readonly string[] | null) {
  const batch = await store.getBatch(batchId)
  if (!batch) return
  let text: string
  try {
    text = await files.contents.text(batch.inputFileId)
  } catch {
    // The input file is gone (deleted right after the batch was created): fail the batch, do
    // not leave it validating.
    post({
      t: 'validated',
      batchId,
      total: 0,
      estimateNano: 0n,
      errors: [
        {
          code: 'file_not_found',
          line: null,
          message: 'the input file could not be read',
          param: 'input_file_id',
        },
      ],
    })
    return
  }
  const pattern = modelPattern(keyModels)
  const { lines, estimateNano, errors } = validateFile(
    batchId,
    batch.endpoint,
    text,
    models,
    pattern ? (id) => pattern.test(id) : undefined,
  )
  if (errors.length === 0) await store.enqueueLines(lines)
  post({ t: 'validated', batchId, total: lines.length, estimateNano, errors })
}

async function finalize(batchId: string, status: BatchStatus) {
  // Always answer, so the scheduler can try again at its next tick if this failed.
  try {
    await writeResults(batchId, status)
    post({ t: 'finalized', batchId })
  } catch (err) {
    post({ t: 'error', batchId, message: String((err as Error)?.stack ?? err) })
  }
}

async function writeResults(batchId: string, asked: BatchStatus) {
  const batch = await store.getBatch(batchId)
  if (!batch) return
  // A batch whose money ran out or whose key was revoked has its error recorded: another node's
  // tick may have seen its last line end first and asked for `completed`.
  const status = asked === 'completed' && batch.errors ? 'failed' : asked
  const ok = await store.lineResults(batchId, true)
  const bad = await store.lineResults(batchId, false)
  const out =
    ok.length > 0
      ? await files.create(batch.orgId, `${batchId}_output.jsonl`, 'batch_output', `${ok.join('\n')}\n`)
      : undefined
  let err: FileRecord | undefined
  try {
    err =
      bad.length > 0
        ? await files.create(batch.orgId, `${batchId}_error.jsonl`, 'batch_output', `${bad.join('\n')}\n`)
        : undefined
  } catch (e) {
    // The disk filled up between the two: the next tick writes both again.
    if (out) await files.remove(batch.orgId, out.id).catch(() => {})
    throw e
  }
  const stamp = endStamp(status, Math.floor(Date.now() / 1000), batch.finalizingAt)
  // Files that did not become the batch's (the store failed, or another node finished first)
  // are removed, so a retry does not leave a second pair behind.
  const discard = async () => {
    if (out) await files.remove(batch.orgId, out.id).catch(() => {})
    if (err) await files.remove(batch.orgId, err.id).catch(() => {})
  }
  let written: boolean
  try {
    written = await store.updateBatch(
      batchId,
      {
        status,
        outputFileId: out?.id ?? null,
        errorFileId: err?.id ?? null,
        costNano: await store.batchCostNano(batchId),
        ...stamp,
      },
      // Not over a final state: another node that took over a stale claim may have finished first.
      ['in_progress', 'finalizing', 'cancelling'],
    )
  } catch (e) {
    await discard()
    throw e
  }
  if (!written) await discard()
}
