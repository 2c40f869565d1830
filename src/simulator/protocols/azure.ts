import type { ProtocolFront, SimCore } from './front.ts'

// Azure OpenAI's data plane as its reference describes it: POST
// /openai/deployments/{deployment}/{chat/completions|embeddings}?api-version=..., the key in the
// `api-key` header, OpenAI's bodies and replies with Azure's additions (prompt_filter_results,
// content_filter_results; a stream opens with an event of empty choices, id and model that carries
// only the prompt's filter results). Errors in Azure's shapes: no api-version or an unknown path
// -> 404 "Resource not found"; a malformed api-version -> 400; a wrong or missing key -> 401.

/** The key the simulated Azure resource accepts (`api-key: <this>`). */
export const SIM_AZURE_API_KEY = 'sim-azure-key'
/** A prompt holding this is refused as Azure refuses a filtered prompt (400 content_filter). */
export const SIM_FILTER_PROMPT = 'SIM_FILTER_PROMPT'
/** A prompt holding this gets an answer whose finish_reason is content_filter. */
export const SIM_FILTER_OUTPUT = 'SIM_FILTER_OUTPUT'

const PATH = /^\/openai\/deployments\/([^/]+)\/(chat\/completions|embeddings)$/
const API_VERSION = /^\d{4}-\d{2}-\d{2}(-preview)?$/
const SAFE = { filtered: false, severity: 'safe' }
const CONTENT_FILTER = { hate: SAFE, self_harm: SAFE, sexual: SAFE, violence: SAFE }
const PROMPT_FILTER = [{ prompt_index: 0, content_filter_results: CONTENT_FILTER }]
const encoder = new TextEncoder()

const azureError = (status: number, code: string, message: string) =>
  Response.json({ error: { code, message } }, { status })

export const azureFront: ProtocolFront = async (req: Request, core: SimCore): Promise<Response> => {
  const url = new URL(req.url)
  const m = PATH.exec(url.pathname)
  if (req.method !== 'POST' || !m) return azureError(404, '404', 'Resource not found')
  const version = url.searchParams.get('api-version')
  if (version === null) return azureError(404, '404', 'Resource not found')
  if (!API_VERSION.test(version)) return azureError(400, 'BadRequest', 'API version not supported')
  if (req.headers.get('api-key') !== SIM_AZURE_API_KEY)
    return azureError(
      401,
      '401',
      'Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.',
    )
  const failed = core.fault()
  if (failed) return failed
  let body: Record<string, unknown>
  try {
    body = (await req.json()) as Record<string, unknown>
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw new Error('not an object')
  } catch {
    return Response.json(
      { error: { message: 'Invalid JSON body', type: 'invalid_request_error', param: null, code: null } },
      { status: 400 },
    )
  }
  // The deployment is the model, whatever the body says.
  body.model = decodeURIComponent(m[1]!)
  if (m[2] === 'embeddings') return core.embeddings(body)
  const prompt = JSON.stringify(body.messages ?? null)
  if (prompt.includes(SIM_FILTER_PROMPT)) return promptFiltered()
  const filterOutput = prompt.includes(SIM_FILTER_OUTPUT)
  const res = await core.chat(body, req.signal)
  if (!res.ok) return res
  return body.stream === true ? azureStream(res, filterOutput) : azureCompletion(res, filterOutput)
}

const FILTERED = { filtered: true, severity: 'high' }

/** Azure's 400 for a prompt its content filter stopped. */
function promptFiltered(): Response {
  return Response.json(
    {
      error: {
        message:
          "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
        type: null,
        param: 'prompt',
        code: 'content_filter',
        status: 400,
        innererror: {
          code: 'ResponsibleAIPolicyViolation',
          content_filter_result: { ...CONTENT_FILTER, violence: FILTERED },
        },
      },
    },
    { status: 400 },
  )
}

/** A completion with Azure's filter results added. */
async function azureCompletion(res: Response, filterOutput: boolean): Promise<Response> {
  let value: { choices?: Record<string, unknown>[]; [k: string]: unknown }
  try {
    value = (await res.json()) as typeof value
  } catch {
    // the node broke its answer (a cut fault): so does Azure's front
    return new Response(
      new ReadableStream({
        start: (c) => c.error(new Error('simulated cut')),
      }),
    )
  }
  for (const choice of value.choices ?? []) {
    choice.content_filter_results = filterOutput ? { ...CONTENT_FILTER, violence: FILTERED } : CONTENT_FILTER
    if (filterOutput) choice.finish_reason = 'content_filter'
  }
  return Response.json({ ...value, prompt_filter_results: PROMPT_FILTER, system_fingerprint: 'fp_sim' })
}

/** The node's stream, opened by Azure's prompt-filter event (empty choices, id and model). */
function azureStream(res: Response, filterOutput: boolean): Response {
  const reader = res.body!.getReader()
  const opening = `data: ${JSON.stringify({ choices: [], created: 0, id: '', model: '', object: '', prompt_filter_results: PROMPT_FILTER })}\n\n`
  let opened = false
  const stream = new ReadableStream<Uint8Array>(
    {
      async pull(c) {
        if (!opened) {
          opened = true
          c.enqueue(encoder.encode(opening))
          return
        }
        const { done, value } = await reader.read()
        if (done) c.close()
        else if (!filterOutput) c.enqueue(value)
        // the node writes one event per chunk: its finish reason becomes Azure's filter's
        else
          c.enqueue(
            encoder.encode(
              new TextDecoder()
                .decode(value)
                .replace(/"finish_reason":"(stop|length)"/, '"finish_reason":"content_filter"'),
            ),
          )
      },
      cancel(reason) {
        return reader.cancel(reason)
      },
    },
    { highWaterMark: 0 },
  )
  return new Response(stream, {
    headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' },
  })
}
