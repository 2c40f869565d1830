import { encode } from '../tokenizer.ts'
import { fnv1a, promptBlockHashes } from './engine.ts'
import { prng, words } from './text.ts'

// POST /v1/completions (legacy) as vLLM serves it: a text, texts, a token array or token arrays
// as the prompt; n choices per prompt (index = prompt * n + choice); echo puts the prompt before
// the text (a token prompt echoes as its ids, the simulator having no detokenizer); logprobs
// gives vLLM's minimal object (each generated token with one top entry); suffix is accepted and
// ignored; best_of must be at least n and only n are generated. Usage counts each prompt once
// and every choice's tokens. Each choice is one sequence of the node's engine.

/** What the endpoint asks of its node. */
export interface SimRun {
  /** Runs one sequence in the node's engine (or at once when the node does not keep time). */
  generate(
    blocks: string[],
    promptTokens: number,
    outputTokens: number,
    h: Handlers,
    signal: AbortSignal,
  ): void
  /** The node's stats this request adds to. */
  readonly stats: {
    completionRequests: number
    streams: number
    promptTokens: number
    completionTokens: number
    cachedTokens: number
  }
  /** Break a stream after this many tokens, or a JSON answer at once (the node's fault). */
  readonly cutAfterTokens: number | null
  /** Every answer runs to its max_tokens. */
  readonly ignoreEos: boolean
  nextSeq(): number
}

/** An engine sequence's events. */
export interface Handlers {
  first(cachedTokens: number): void
  token(index: number): void
  done(): void
}

interface LegacyBody {
  model?: unknown
  prompt?: unknown
  max_tokens?: unknown
  n?: unknown
  best_of?: unknown
  echo?: unknown
  logprobs?: unknown
  seed?: unknown
  stream?: unknown
  stream_options?: { include_usage?: unknown } | null
}

interface Prompt {
  readonly tokens: number[]
  /** What echo shows. */
  readonly text: string
}

interface Choice {
  readonly index: number
  readonly prompt: Prompt
  readonly pieces: string[]
  readonly finish: 'stop' | 'length'
  cached: number
}

const encoder = new TextEncoder()
/** vLLM's default when max_tokens is absent. */
const DEFAULT_MAX_TOKENS = 16

export function legacyCompletion(
  body: LegacyBody,
  signal: AbortSignal,
  run: SimRun,
): Response | Promise<Response> {
  if (typeof body.model !== 'string') return invalid('model is required')
  const prompts = promptsOf(body.prompt)
  if (!prompts) return invalid('prompt must be a string, an array of strings, or token arrays')
  const n = body.n == null ? 1 : body.n
  if (!Number.isInteger(n) || (n as number) < 1) return invalid('n must be a positive integer')
  if (body.best_of != null && (!Number.isInteger(body.best_of) || (body.best_of as number) < (n as number)))
    return invalid('best_of must be greater than or equal to n')
  const logprobs = body.logprobs == null ? null : body.logprobs
  if (logprobs !== null && (!Number.isInteger(logprobs) || (logprobs as number) < 0))
    return invalid('logprobs must be a non-negative integer')
  const cap = body.max_tokens == null ? DEFAULT_MAX_TOKENS : body.max_tokens
  if (!Number.isInteger(cap) || (cap as number) < 1) return invalid('max_tokens must be a positive integer')
  const echo = body.echo === true
  run.stats.completionRequests++
  const model = body.model
  const seedPart = typeof body.seed === 'number' ? body.seed : 0
  const choices: Choice[] = []
  for (const [p, prompt] of prompts.entries())
    for (let j = 0; j < (n as number); j++) {
      // Text depends on the request only, so every node answers the same seed alike.
      const rand = prng(
        fnv1a(`${seedPart}:${j}:${prompt.tokens.length}:${prompt.tokens.slice(-64).join(',')}`),
      )
      const drawn = 8 + Math.floor(rand() * 57)
      const wanted = run.ignoreEos ? (cap as number) : drawn
      const count = Math.max(1, Math.min(wanted, cap as number))
      const finish = count < wanted || run.ignoreEos ? 'length' : 'stop'
      choices.push({ index: p * (n as number) + j, prompt, pieces: words(rand, count), finish, cached: 0 })
    }
  const promptTokens = prompts.reduce((s, p) => s + p.tokens.length, 0)
  const completionTokens = choices.reduce((s, c) => s + c.pieces.length, 0)
  run.stats.promptTokens += promptTokens
  const usage = () => {
    const cached = choices.reduce((s, c) => s + c.cached, 0)
    return {
      prompt_tokens: promptTokens,
      completion_tokens: completionTokens,
      total_tokens: promptTokens + completionTokens,
      prompt_tokens_details: { cached_tokens: cached },
    }
  }
  const counted = () => {
    run.stats.completionTokens += completionTokens
    run.stats.cachedTokens += choices.reduce((s, c) => s + c.cached, 0)
  }
  const id = `cmpl-sim${run.nextSeq()}`
  const created = Math.floor(Date.now() / 1000)
  const blocksOf = new Map(prompts.map((p) => [p, promptBlockHashes(model, p.tokens)]))
  let left = choices.length
  const start = (c: Choice, h: Handlers) =>
    run.generate(blocksOf.get(c.prompt)!, c.prompt.tokens.length, c.pieces.length, h, signal)

  if (body.stream !== true) {
    return new Promise<Response>((resolve) => {
      const done = () => {
        if (--left > 0) return
        counted()
        if (run.cutAfterTokens !== null) return resolve(brokenResponse())
        resolve(
          Response.json({
            id,
            object: 'text_completion',
            created,
            model,
            choices: choices.map((c) => ({
              index: c.index,
              text: (echo ? c.prompt.text : '') + c.pieces.join(''),
              logprobs: logprobs === null ? null : logprobsOf(c.pieces, 0, echo ? c.prompt.text.length : 0),
              finish_reason: c.finish,
              stop_reason: null,
            })),
            usage: usage(),
          }),
        )
      }
      for (const c of choices)
        start(c, {
          first: (cached) => {
            c.cached = cached
          },
          token: () => {},
          done,
        })
    })
  }

  run.stats.streams++
  const includeUsage = body.stream_options?.include_usage === true
  const head = `{"id":"${id}","object":"text_completion","created":${created},"model":${JSON.stringify(model)},"choices":[`
  let controller!: ReadableStreamDefaultController<Uint8Array>
  let closed = false
  let sent = 0
  const send = (text: string) => {
    if (!closed) controller.enqueue(encoder.encode(text))
  }
  const emit = (c: Choice, i: number) => {
    if (closed) return
    if (run.cutAfterTokens !== null && sent >= run.cutAfterTokens) {
      closed = true
      controller.error(new Error('simulated cut'))
      return
    }
    const offset = echo ? c.prompt.text.length : 0
    let text = c.pieces[i]!
    if (i === 0 && echo) text = c.prompt.text + text
    const last = i === c.pieces.length - 1
    const lp =
      logprobs === null ? 'null' : JSON.stringify(logprobsOf([c.pieces[i]!], i, offset + textBefore(c, i)))
    send(
      `data: ${head}{"index":${c.index},"text":${JSON.stringify(text)},"logprobs":${lp},"finish_reason":${last ? `"${c.finish}"` : 'null'},"stop_reason":null}]}\n\n`,
    )
    sent++
  }
  const stream = new ReadableStream<Uint8Array>({
    start(c) {
      controller = c
    },
    cancel() {
      closed = true
    },
  })
  for (const c of choices)
    start(c, {
      first: (cached) => {
        c.cached = cached
        emit(c, 0)
      },
      token: (i) => emit(c, i),
      done: () => {
        if (--left > 0 || closed) return
        counted()
        if (includeUsage) send(`data: ${head}],"usage":${JSON.stringify(usage())}}\n\n`)
        send('data: [DONE]\n\n')
        closed = true
        controller.close()
      },
    })
  return new Response(stream, {
    headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' },
  })
}

/** The prompts of a body, or undefined when it has none of the four shapes. */
function promptsOf(prompt: unknown): Prompt[] | undefined {
  const ofText = (text: string): Prompt => ({ tokens: encode(text), text })
  const ofIds = (ids: unknown[]): Prompt | undefined =>
    ids.every((t) => Number.isInteger(t) && (t as number) >= 0)
      ? { tokens: ids as number[], text: ids.join(' ') }
      : undefined
  if (typeof prompt === 'string') return [ofText(prompt)]
  if (!Array.isArray(prompt) || prompt.length === 0) return undefined
  if (typeof prompt[0] === 'number') {
    const one = ofIds(prompt)
    return one && [one]
  }
  const out: Prompt[] = []
  for (const p of prompt) {
    const one = typeof p === 'string' ? ofText(p) : Array.isArray(p) && p.length > 0 ? ofIds(p) : undefined
    if (!one) return undefined
    out.push(one)
  }
  return out
}

/** The text of a choice before its token i (the offsets logprobs report). */
function textBefore(c: Choice, i: number): number {
  let n = 0
  for (let k = 0; k < i; k++) n += c.pieces[k]!.length
  return n
}

/** vLLM's legacy logprobs object for some generated tokens, with a made-up probability. */
function logprobsOf(tokens: readonly string[], first: number, offset: number) {
  const lp = (i: number) => -((((first + i) * 7) % 10) + 1) / 10
  const textOffset: number[] = []
  let at = offset
  for (const t of tokens) {
    textOffset.push(at)
    at += t.length
  }
  return {
    tokens,
    token_logprobs: tokens.map((_, i) => lp(i)),
    top_logprobs: tokens.map((t, i) => ({ [t]: lp(i) })),
    text_offset: textOffset,
  }
}

function invalid(message: string): Response {
  return Response.json(
    { error: { message, type: 'invalid_request_error', param: null, code: null } },
    { status: 400 },
  )
}

/** A 200 whose body breaks at once: the connection dies with no complete response. */
function brokenResponse(): Response {
  return new Response(
    new ReadableStream({
      start(c) {
        c.enqueue(encoder.encode('{"id":'))
        c.error(new Error('simulated cut'))
      },
    }),
    { headers: { 'content-type': 'application/json' } },
  )
}
