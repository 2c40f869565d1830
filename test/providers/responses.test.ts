import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import net from 'node:net'
import OpenAI, { toFile } from 'openai'
import { batchCostNano, costNano, formatRub, rubNumberToNano } from '../../src/billing/money.ts'
import { ResponsesStreamTranslator, responsesStream } from '../../src/responses/stream.ts'
import { newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

// OpenAI's Responses API on Tropa, over the default OpenAI-protocol simulated nodes, through the
// official SDK: translated into a chat request, billed as one.
const weather = {
  type: 'function' as const,
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string' } },
    required: ['city'],
    additionalProperties: false,
  },
  strict: true,
}

async function otherOrgClient(t: Tropa): Promise<OpenAI> {
  const res = await t.admin('/v1/admin/organizations', { name: `other-${Date.now()}`, balance_rub: 10 })
  const org = (await res.json()) as { master_key: string }
  const k = await newApiKey(t, { name: 'other' }, org.master_key)
  return t.client(k.key)
}

function suite(name: string, postgres: boolean) {
  describe(`responses (${name})`, () => {
    let t: Tropa
    let client: OpenAI
    beforeAll(async () => {
      t = await startTropa({ postgres })
      client = t.client()
    })
    afterAll(() => t.stop())

    test('string input: a completed response, output_text, usage and cost as for the same chat request', async () => {
      const { data: r, response } = await client.responses
        .create({ model: 'test/chat', input: 'Tell me about routers.', max_output_tokens: 40 })
        .withResponse()
      expect(r.id).toMatch(/^resp_/)
      expect(r.object).toBe('response')
      expect(r.model).toBe('test/chat')
      expect((r as unknown as { store: boolean }).store).toBe(true)
      expect(['completed', 'incomplete']).toContain(r.status!)
      expect(r.output).toHaveLength(1)
      const item = r.output[0]!
      expect(item.type).toBe('message')
      if (item.type !== 'message') throw new Error('not a message')
      expect(item.id).toMatch(/^msg_/)
      expect(item.role).toBe('assistant')
      expect(item.content[0]!.type).toBe('output_text')
      expect(r.output_text.length).toBeGreaterThan(0)
      const u = r.usage!
      expect(u.total_tokens).toBe(u.input_tokens + u.output_tokens)
      expect(u.output_tokens_details.reasoning_tokens).toBe(0)
      expect(typeof u.input_tokens_details.cached_tokens).toBe('number')

      // The same request as chat: same prompt, same tokens, same text, same cost.
      const { data: c, response: chatRes } = await client.chat.completions
        .create({
          model: 'test/chat',
          messages: [{ role: 'user', content: 'Tell me about routers.' }],
          max_tokens: 40,
        })
        .withResponse()
      expect(u.input_tokens).toBe(c.usage!.prompt_tokens)
      expect(u.output_tokens).toBe(c.usage!.completion_tokens)
      expect(r.output_text).toBe(c.choices[0]!.message.content!)
      const price = t.svc.deps.catalogue.getOfKind('test/chat', 'chat').price
      const cost = formatRub(costNano(u.input_tokens, u.output_tokens, price))
      expect(response.headers.get('x-tropa-cost-rub')).toBe(cost)
      expect(chatRes.headers.get('x-tropa-cost-rub')).toBe(cost)
      expect((u as unknown as { cost_rub: number }).cost_rub).toBe(Number(cost))
      // The ledger has it at that cost.
      await t.svc.ledger.flush()
      const rows = await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)
      expect(rows.some((row) => row.costNano === rubNumberToNano(Number(cost)))).toBe(true)
    })

    test('item input with instructions, a developer message and content parts', async () => {
      const r = await client.responses.create({
        model: 'test/chat',
        instructions: 'Answer briefly.',
        input: [
          { role: 'developer', content: 'Be kind.' },
          { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hello there' }] },
          { role: 'assistant', content: 'Hi!' },
          { role: 'user', content: 'And now?' },
        ],
        max_output_tokens: 10,
      })
      expect(r.instructions).toBe('Answer briefly.')
      expect(r.output_text.length).toBeGreaterThan(0)
      const short = await client.responses.create({
        model: 'test/chat',
        input: 'And now?',
        max_output_tokens: 10,
      })
      expect(r.usage!.input_tokens).toBeGreaterThan(short.usage!.input_tokens + 8)
    })

    test('max_output_tokens reached: incomplete, with its reason', async () => {
      const r = await client.responses.create({
        model: 'test/chat',
        input: 'Tell me a long story.',
        max_output_tokens: 2,
      })
      expect(r.status).toBe('incomplete')
      expect(r.incomplete_details).toEqual({ reason: 'max_output_tokens' })
      expect(r.usage!.output_tokens).toBe(2)
    })

    test('a function tool round trip: function_call, then its output with previous_response_id', async () => {
      const first = await client.responses.create({
        model: 'test/chat',
        input: 'What is the weather in Paris?',
        tools: [weather],
      })
      expect(first.status).toBe('completed')
      const call = first.output.find((o) => o.type === 'function_call')
      if (call?.type !== 'function_call') throw new Error('no function call')
      expect(call.id).toMatch(/^fc_/)
      expect(call.name).toBe('get_weather')
      expect(JSON.parse(call.arguments)).toHaveProperty('city')
      expect(first.tools).toHaveLength(1)

      const second = await client.responses.create({
        model: 'test/chat',
        previous_response_id: first.id,
        input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"temp_c": 21}' }],
        tools: [weather],
      })
      // The tool's answer is the last turn, so the model answers in words.
      expect(second.previous_response_id).toBe(first.id)
      expect(second.output[0]!.type).toBe('message')
      expect(second.output_text.length).toBeGreaterThan(0)
      expect(second.usage!.input_tokens).toBeGreaterThan(first.usage!.input_tokens)

      // A function_call_output whose call is nowhere in the conversation: a clear 400.
      const err = await client.responses
        .create({
          model: 'test/chat',
          input: [{ type: 'function_call_output', call_id: 'call_nope', output: 'x' }],
        })
        .catch((e) => e)
      expect(err).toBeInstanceOf(OpenAI.BadRequestError)
      expect(err.param).toBe('input[0].call_id')
    })

    test('function_call items in the input continue a conversation without store', async () => {
      const r = await client.responses.create({
        model: 'test/chat',
        store: false,
        input: [
          { role: 'user', content: 'Weather in Oslo?' },
          { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Oslo"}' },
          { type: 'function_call_output', call_id: 'call_1', output: '{"temp_c": -3}' },
        ],
        tools: [weather],
      })
      expect(r.output[0]!.type).toBe('message')
      expect((r as unknown as { store: boolean }).store).toBe(false)
    })

    test('previous_response_id continues the conversation: the node sees the earlier turns', async () => {
      const a = await client.responses.create({
        model: 'test/chat',
        input: 'My name is Ada.',
        max_output_tokens: 8,
      })
      const b = await client.responses.create({
        model: 'test/chat',
        previous_response_id: a.id,
        input: 'What is my name?',
        max_output_tokens: 8,
      })
      const alone = await client.responses.create({
        model: 'test/chat',
        input: 'What is my name?',
        max_output_tokens: 8,
        store: false,
      })
      // The earlier turn (its input and its answer) is in the prompt.
      expect(b.usage!.input_tokens).toBeGreaterThan(alone.usage!.input_tokens + a.usage!.output_tokens)
      const c = await client.responses.create({
        model: 'test/chat',
        previous_response_id: b.id,
        input: 'Again?',
        max_output_tokens: 8,
      })
      expect(c.usage!.input_tokens).toBeGreaterThan(b.usage!.input_tokens + b.usage!.output_tokens)
    })

    test('retrieve and delete per organization; store: false is not kept', async () => {
      const r = await client.responses.create({
        model: 'test/chat',
        input: 'Keep this.',
        max_output_tokens: 8,
        metadata: { purpose: 'test' },
      })
      const got = await client.responses.retrieve(r.id)
      expect(got.id).toBe(r.id)
      expect(got.output_text).toBe(r.output_text)
      expect(got.usage).toEqual(r.usage)
      expect(got.metadata).toEqual({ purpose: 'test' })

      // Another organization can neither read it, continue from it nor delete it.
      const other = await otherOrgClient(t)
      expect(await other.responses.retrieve(r.id).catch((e) => e)).toBeInstanceOf(OpenAI.NotFoundError)
      const cont = await other.responses
        .create({ model: 'test/chat', previous_response_id: r.id, input: 'steal' })
        .catch((e) => e)
      expect(cont).toBeInstanceOf(OpenAI.NotFoundError)
      expect(cont.param).toBe('previous_response_id')
      expect(cont.code).toBe('response_not_found')
      expect(await other.responses.delete(r.id).catch((e) => e)).toBeInstanceOf(OpenAI.NotFoundError)

      const raw = await t.fetch(`/v1/responses/${r.id}`, { method: 'DELETE' })
      expect(await raw.json()).toEqual({ id: r.id, object: 'response', deleted: true })
      expect(await client.responses.retrieve(r.id).catch((e) => e)).toBeInstanceOf(OpenAI.NotFoundError)
      expect(await client.responses.delete(r.id).catch((e) => e)).toBeInstanceOf(OpenAI.NotFoundError)

      const unstored = await client.responses.create({
        model: 'test/chat',
        input: 'Forget this.',
        max_output_tokens: 4,
        store: false,
      })
      expect((unstored as unknown as { store: boolean }).store).toBe(false)
      expect(await client.responses.retrieve(unstored.id).catch((e) => e)).toBeInstanceOf(
        OpenAI.NotFoundError,
      )
      const unknown = await client.responses
        .create({ model: 'test/chat', previous_response_id: 'resp_unknown', input: 'x' })
        .catch((e) => e)
      expect(unknown).toBeInstanceOf(OpenAI.NotFoundError)
    })

    test("input_items lists a response's conversation and input, newest first, in pages", async () => {
      const a = await client.responses.create({
        model: 'test/chat',
        input: [
          { role: 'developer', content: 'Be kind.' },
          { role: 'user', content: [{ type: 'input_text', text: 'Hello' }] },
        ],
        max_output_tokens: 4,
      })
      const b = await client.responses.create({
        model: 'test/chat',
        previous_response_id: a.id,
        input: 'Next',
        max_output_tokens: 4,
      })
      const page = await client.responses.inputItems.list(b.id)
      const texts = page.data.map((item) => {
        if (item.type !== 'message') throw new Error(`unexpected ${item.type}`)
        return [item.role, (item.content[0] as { text: string }).text]
      })
      expect(texts).toEqual([
        ['user', 'Next'],
        ['assistant', a.output_text],
        ['user', 'Hello'],
        ['developer', 'Be kind.'],
      ])
      // a's answer keeps its id; every other item got one.
      expect(page.data[1]!.id).toBe(a.output[0]!.id!)
      for (const item of page.data) expect(item.id).toMatch(/^msg_/)
      const asc = await client.responses.inputItems.list(b.id, { order: 'asc', limit: 2 })
      expect(asc.data.map((i) => i.id)).toEqual([page.data[3]!.id, page.data[2]!.id])
      expect(asc.has_more).toBe(true)
      const rest = await client.responses.inputItems.list(b.id, {
        order: 'asc',
        limit: 2,
        after: asc.data[1]!.id,
      })
      expect(rest.data.map((i) => i.id)).toEqual([page.data[1]!.id, page.data[0]!.id])
      expect(rest.has_more).toBe(false)
      const other = await otherOrgClient(t)
      expect(await other.responses.inputItems.list(b.id).catch((e) => e)).toBeInstanceOf(OpenAI.NotFoundError)
    })

    test('streaming: the documented events in order with sequence numbers, then retrievable', async () => {
      const stream = await client.responses.create({
        model: 'test/chat',
        input: 'Stream to me.',
        max_output_tokens: 30,
        stream: true,
      })
      const events: { type: string; sequence_number: number; [k: string]: unknown }[] = []
      for await (const e of stream) events.push(e as never)
      expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i))
      const types = events.map((e) => e.type)
      const deltas = types.filter((x) => x === 'response.output_text.delta').length
      expect(deltas).toBeGreaterThan(0)
      const last = events.at(-1)!
      const final = (last as unknown as { response: OpenAI.Responses.Response }).response
      expect(types).toEqual([
        'response.created',
        'response.in_progress',
        'response.output_item.added',
        'response.content_part.added',
        ...Array(deltas).fill('response.output_text.delta'),
        'response.output_text.done',
        'response.content_part.done',
        'response.output_item.done',
        final.status === 'incomplete' ? 'response.incomplete' : 'response.completed',
      ])
      const text = events
        .filter((e) => e.type === 'response.output_text.delta')
        .map((e) => e.delta)
        .join('')
      expect(
        (events.find((e) => e.type === 'response.output_text.done') as unknown as { text: string }).text,
      ).toBe(text)
      expect(final.output).toHaveLength(1)
      expect(final.usage!.output_tokens).toBeGreaterThan(0)
      expect(final.usage!.total_tokens).toBe(final.usage!.input_tokens + final.usage!.output_tokens)
      const price = t.svc.deps.catalogue.getOfKind('test/chat', 'chat').price
      expect((final.usage as unknown as { cost_rub: number }).cost_rub).toBe(
        Number(formatRub(costNano(final.usage!.input_tokens, final.usage!.output_tokens, price))),
      )
      // Stored before response.completed was sent.
      const got = await client.responses.retrieve(final.id)
      expect(got.output_text).toBe(text)

      // The same request unstreamed costs the same and says the same.
      const plain = await client.responses.create({
        model: 'test/chat',
        input: 'Stream to me.',
        max_output_tokens: 30,
      })
      // (the simulator trims the leading space of a whole answer, not of a stream's first token)
      expect(plain.output_text).toBe(text.trimStart())
      expect(plain.usage!.input_tokens).toBe(final.usage!.input_tokens)
    })

    test('streaming a function call: arguments deltas, then done, with the SDK stream helper', async () => {
      const stream = client.responses.stream({
        model: 'test/chat',
        input: 'Weather in Rome?',
        tools: [weather],
      })
      const types: string[] = []
      let args = ''
      for await (const e of stream) {
        types.push(e.type)
        if (e.type === 'response.function_call_arguments.delta') args += e.delta
      }
      const final = await stream.finalResponse()
      const call = final.output[0]!
      if (call.type !== 'function_call') throw new Error('no function call')
      expect(call.arguments).toBe(args)
      expect(JSON.parse(args)).toHaveProperty('city')
      expect(types[2]).toBe('response.output_item.added')
      expect(types).toContain('response.function_call_arguments.done')
      expect(types.at(-2)).toBe('response.output_item.done')
      expect(types.at(-1)).toBe('response.completed')
    })

    test('refused clearly: built-in tools, unknown fields, unsupported items and parts', async () => {
      const cases: [Record<string, unknown>, string][] = [
        [{ tools: [{ type: 'web_search' }] }, 'tools[0].type'],
        [{ reasoning_effort: 'high' }, 'reasoning_effort'],
        [{ input: [{ type: 'item_reference', id: 'x' }] }, 'input[0].type'],
        [
          { input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'f' }] }] },
          'input[0].content[0].type',
        ],
        [
          { input: [{ role: 'user', content: [{ type: 'input_image', file_id: 'f' }] }] },
          'input[0].content[0].image_url',
        ],
        [{ input: [] }, 'input'],
        [{ input: [{ role: 'user', content: null }] }, 'input[0].content'],
        [{ input: [{ role: 'tool', content: 'x' }] }, 'input[0].role'],
        [
          { input: [{ type: 'function_call', call_id: 'c', name: 'f', arguments: {} }] },
          'input[0].arguments',
        ],
        [
          { input: [{ role: 'system', content: [{ type: 'input_image', image_url: 'https://x/y.png' }] }] },
          'input[0].content',
        ],
        [
          { input: [{ role: 'user', content: [{ type: 'input_text', text: 5 }] }] },
          'input[0].content[0].text',
        ],
        [{ tools: [{ type: 'function', description: 'no name' }] }, 'tools[0].name'],
        [{ previous_response_id: '' }, 'previous_response_id'],
        [{ metadata: { ['k'.repeat(65)]: 'v' } }, 'metadata'],
        [{ metadata: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, 'v'])) }, 'metadata'],
      ]
      for (const [extra, param] of cases) {
        const res = await t.fetch('/v1/responses', {
          method: 'POST',
          body: JSON.stringify({ model: 'test/chat', input: 'hi', ...extra }),
        })
        const body = (await res.json()) as { error: { param: string; message: string } }
        expect([res.status, body.error.param]).toEqual([400, param])
      }
      const noKey = await t.fetch('/v1/responses', { method: 'POST', key: null, body: '{}' })
      expect(noKey.status).toBe(401)
    })

    test('a batch of /v1/responses lines: Response objects in the output file, billed at half', async () => {
      const bodies = [
        { model: 'test/chat', input: 'First line.', max_output_tokens: 6 },
        { model: 'test/chat', instructions: 'Be brief.', input: [{ role: 'user', content: 'Second.' }] },
        { model: 'test/chat', input: 'Weather in Rome?', tools: [weather] },
      ]
      const lines = bodies.map((body, i) =>
        JSON.stringify({ custom_id: `r${i}`, method: 'POST', url: '/v1/responses', body }),
      )
      const bad = [
        { custom_id: 'bad-stream', body: { model: 'test/chat', input: 'x', stream: true } },
        { custom_id: 'bad-prev', body: { model: 'test/chat', input: 'x', previous_response_id: 'resp_x' } },
        { custom_id: 'bad-tool', body: { model: 'test/chat', input: 'x', tools: [{ type: 'web_search' }] } },
      ].map((l) => JSON.stringify({ ...l, method: 'POST', url: '/v1/responses' }))
      const file = await client.files.create({
        file: await toFile(Buffer.from(`${[...lines, ...bad].join('\n')}\n`), 'responses.jsonl'),
        purpose: 'batch',
      })
      let b = await client.batches.create({
        input_file_id: file.id,
        endpoint: '/v1/responses',
        completion_window: '24h',
      })
      for (let i = 0; i < 1200 && !['completed', 'failed'].includes(b.status); i++) {
        await Bun.sleep(25)
        b = await client.batches.retrieve(b.id)
      }
      // A file with invalid lines fails validation as a whole, naming each line.
      expect(b.status).toBe('failed')
      expect(b.errors!.data!.map((e) => [e.line, e.param])).toEqual([
        [4, 'body.stream'],
        [5, 'body.previous_response_id'],
        [6, 'body.tools[0].type'],
      ])

      const good = await client.files.create({
        file: await toFile(Buffer.from(`${lines.join('\n')}\n`), 'responses.jsonl'),
        purpose: 'batch',
      })
      b = await client.batches.create({
        input_file_id: good.id,
        endpoint: '/v1/responses',
        completion_window: '24h',
      })
      for (let i = 0; i < 1200 && !['completed', 'failed'].includes(b.status); i++) {
        await Bun.sleep(25)
        b = await client.batches.retrieve(b.id)
      }
      expect(b.status).toBe('completed')
      expect(b.request_counts).toEqual({ total: 3, completed: 3, failed: 0 })
      const out = (await (await client.files.content(b.output_file_id!)).text())
        .trim()
        .split('\n')
        .map(
          (l) =>
            JSON.parse(l) as {
              custom_id: string
              response: { status_code: number; body: OpenAI.Responses.Response }
            },
        )
        .sort((x, y) => x.custom_id.localeCompare(y.custom_id))
      expect(out.map((o) => o.response.status_code)).toEqual([200, 200, 200])
      for (const o of out) {
        expect(o.response.body.object).toBe('response')
        expect(o.response.body.id).toMatch(/^resp_/)
        expect(o.response.body.model).toBe('test/chat')
      }
      expect(out[0]!.response.body.usage!.output_tokens).toBeLessThanOrEqual(6)
      expect(out[1]!.response.body.instructions).toBe('Be brief.')
      expect(out[2]!.response.body.output[0]!.type).toBe('function_call')
      // Billed as chat batch lines: half the live price of the usage each line shows.
      await t.svc.ledger.flush()
      const price = t.svc.deps.catalogue.getOfKind('test/chat', 'chat').price
      const billed = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000))
        .filter((r) => r.batchId === b.id)
        .map((r) => r.costNano)
        .sort()
      const expected = out
        .map((o) =>
          batchCostNano(
            costNano(o.response.body.usage!.input_tokens, o.response.body.usage!.output_tokens, price),
          ),
        )
        .sort()
      expect(billed).toEqual(expected)
      // Not stored: a batch line's response cannot be retrieved or continued.
      expect(await client.responses.retrieve(out[0]!.response.body.id).catch((e) => e)).toBeInstanceOf(
        OpenAI.NotFoundError,
      )
    }, 60_000)

    test('a Codex-style request (reasoning, include, prompt_cache_key, store false, streamed) is served', async () => {
      const stream = await client.responses.create({
        model: 'test/chat',
        instructions: 'You are a coding agent.',
        input: [
          { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'List the files.' }] },
        ],
        tools: [weather],
        tool_choice: 'auto',
        parallel_tool_calls: false,
        reasoning: { effort: 'medium', summary: 'auto' },
        store: false,
        stream: true,
        include: ['reasoning.encrypted_content'],
        prompt_cache_key: 'session-1',
      })
      let final: OpenAI.Responses.Response | undefined
      for await (const e of stream) if (e.type === 'response.completed') final = e.response
      expect(final?.output[0]?.type).toBe('function_call')
      expect(final?.parallel_tool_calls).toBe(false)
    })

    test('an image by data URL reaches the model as an image part', async () => {
      const png =
        'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='
      const r = await client.responses.create({
        model: 'test/chat',
        input: [
          {
            role: 'user',
            content: [
              { type: 'input_text', text: 'What is this?' },
              { type: 'input_image', image_url: png, detail: 'auto' },
            ],
          },
        ],
        max_output_tokens: 5,
      })
      expect(r.output_text.length).toBeGreaterThan(0)
    })
  })
}

suite('SQLite', false)
suite('PostgreSQL', true)

describe('responses: faults and bounds', () => {
  let t: Tropa | undefined
  afterAll(() => t?.stop())
  const usageRows = async (x: Tropa) => {
    await x.svc.ledger.flush()
    return (await x.svc.store.ledgerForOrg(x.orgId, 0, Date.now() + 1000)).filter((r) => r.kind === 'usage')
  }

  test('a node cut mid-stream: response.failed, the sent tokens billed, nothing stored', async () => {
    t = await startTropa({ nodes: [{ name: 'cut', itlMs: 2, faults: { cutAfterTokens: 3 } }] })
    const res = await t.fetch('/v1/responses', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', input: 'hi', stream: true, max_output_tokens: 40 }),
    })
    expect(res.status).toBe(200)
    const events = (await res.text())
      .split('\n\n')
      .filter(Boolean)
      .map(
        (e) =>
          JSON.parse(e.split('\n')[1]!.slice(6)) as {
            type: string
            response?: { id: string; status: string; error: { message: string } }
          },
      )
    const last = events.at(-1)!
    expect(last.type).toBe('response.failed')
    expect(last.response!.status).toBe('failed')
    expect(last.response!.error.message).toContain('broke the stream')
    // The node sends 3 tokens then breaks (the last may be lost with the connection): the
    // client is billed the tokens it was sent.
    const deltas = events.filter((e) => e.type === 'response.output_text.delta').length
    expect(deltas).toBeGreaterThan(0)
    expect(deltas).toBeLessThanOrEqual(3)
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]!.completionTokens).toBe(deltas)
    expect((await t.fetch(`/v1/responses/${last.response!.id}`)).status).toBe(404)
    await t.stop()
    t = undefined
  })

  test('a client that disconnects mid-stream cancels the upstream and pays for what it was sent', async () => {
    t = await startTropa({ nodes: [{ name: 'slow', itlMs: 20, timeScale: 1 }] })
    const controller = new AbortController()
    const res = await t.fetch('/v1/responses', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', input: 'hi', stream: true, max_output_tokens: 60 }),
      signal: controller.signal,
    })
    const reader = res.body!.getReader()
    let received = ''
    while (received.split('response.output_text.delta').length < 6) {
      const { value } = await reader.read()
      received += new TextDecoder().decode(value)
    }
    controller.abort()
    for (let i = 0; i < 100 && t.nodes[0]!.stats().aborted === 0; i++) await Bun.sleep(10)
    expect(t.nodes[0]!.stats().aborted).toBe(1)
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]!.outcome).toBe('client_disconnected')
    expect(rows[0]!.completionTokens).toBeGreaterThan(0)
    expect(rows[0]!.completionTokens).toBeLessThan(60)
    await t.stop()
    t = undefined
  })

  test('a conversation too big to store is refused before anything is billed; store: false is not bounded by it', async () => {
    t = await startTropa({ extra: { responses: { max_stored_bytes: 100_000 } } })
    const big = 'a '.repeat(60_000)
    const res = await t.fetch('/v1/responses', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', input: big }),
    })
    const body = (await res.json()) as { error: { param: string; message: string } }
    expect(res.status).toBe(400)
    expect(body.error.param).toBe('input')
    expect(body.error.message).toContain('more than 100000')
    // Unstored, the same input meets the model's context instead.
    const unstored = await t.fetch('/v1/responses', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', input: big, store: false }),
    })
    expect(unstored.status).toBe(400)
    expect(((await unstored.json()) as { error: { code: string } }).error.code).toBe(
      'context_length_exceeded',
    )
    expect(await usageRows(t)).toHaveLength(0)
  })

  test('a response past responses.retention_days (30) is gone, and swept from the store', async () => {
    const x = t!
    const old = Math.floor(Date.now() / 1000) - 31 * 86_400
    const conversation = JSON.stringify([{ type: 'message', role: 'user', content: 'old' }])
    await x.svc.store.putResponse({
      id: 'resp_old',
      orgId: x.orgId,
      conversation,
      response: '{}',
      createdAt: old,
    })
    const recent = Math.floor(Date.now() / 1000) - 29 * 86_400
    await x.svc.store.putResponse({
      id: 'resp_recent',
      orgId: x.orgId,
      conversation,
      response: '{"id":"resp_recent"}',
      createdAt: recent,
    })
    expect((await x.fetch('/v1/responses/resp_old')).status).toBe(404)
    expect((await x.fetch('/v1/responses/resp_recent')).status).toBe(200)
    const cont = await x.fetch('/v1/responses', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', input: 'x', previous_response_id: 'resp_old' }),
    })
    expect(cont.status).toBe(404)
    // Storing a response starts the sweep.
    await x.client().responses.create({ model: 'test/chat', input: 'new', max_output_tokens: 3 })
    for (let i = 0; i < 100 && (await x.svc.store.getResponse(x.orgId, 'resp_old')); i++) await Bun.sleep(10)
    expect(await x.svc.store.getResponse(x.orgId, 'resp_old')).toBeUndefined()
    expect(await x.svc.store.getResponse(x.orgId, 'resp_recent')).toBeDefined()
  })
})

test('the responses stream reads the chat stream only as its client reads (bounded buffering)', async () => {
  let pulls = 0
  const chunk = (i: number) =>
    new TextEncoder().encode(
      `data: {"id":"c","choices":[{"index":0,"delta":{"content":"w${i} "},"finish_reason":null}]}\n\n`,
    )
  const chat = new ReadableStream<Uint8Array>(
    {
      pull(c) {
        pulls++
        c.enqueue(chunk(pulls))
      },
    },
    { highWaterMark: 0 },
  )
  const head = { id: 'resp_x', createdAt: 1, model: 'm', body: { model: 'm', input: 'x' }, store: false }
  const out = responsesStream(chat, new ResponsesStreamTranslator(head), async (r) => r)
  const reader = out.getReader()
  for (let i = 0; i < 5; i++) await reader.read()
  await Bun.sleep(50)
  // created+in_progress, then one chat chunk per read: nothing read ahead while nobody reads.
  expect(pulls).toBeLessThanOrEqual(5)
  await reader.cancel()
})

test('a streamed response whose client never reads is cut at the stall timeout and billed what was sent, not the whole answer', async () => {
  const LONG = 80_000
  const t = await startTropa({
    nodes: [
      {
        name: 'fast',
        ignoreEos: true,
        itlMs: 0.1,
        iterationOverheadMs: 0,
        decodeMsPerSeq: 0,
        prefillTokensPerSec: 10_000_000,
      },
    ],
    models: ([fast]) => [
      {
        id: 'test/long',
        context_length: 100_000,
        pricing: { prompt: '0.000030', completion: '0.000060' },
        routes: [{ name: 'fast', base_url: fast!.url }],
      },
    ],
  })
  try {
    // (server.stream_write_timeout_ms, shortened for this test)
    ;(t.svc.deps as { streamWriteTimeoutMs: number }).streamWriteTimeoutMs = 500
    const body = JSON.stringify({ model: 'test/long', input: 'go', stream: true, max_output_tokens: LONG })
    const socket = net.connect(Number(new URL(t.url).port), '127.0.0.1')
    socket.on('error', () => {})
    socket.pause()
    socket.on('connect', () => {
      socket.write(
        `POST /v1/responses HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${t.apiKey}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      )
      socket.pause()
    })
    let rows: Awaited<ReturnType<typeof t.svc.store.ledgerForOrg>> = []
    for (let i = 0; i < 500 && rows.length === 0; i++) {
      await Bun.sleep(20)
      await t.svc.ledger.flush()
      rows = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter((r) => r.kind === 'usage')
    }
    expect(rows).toHaveLength(1)
    expect(rows[0]!.outcome).toBe('client_stalled')
    expect(rows[0]!.completionTokens).toBeGreaterThan(0)
    // What the socket's buffers took, not the whole answer generated without backpressure.
    expect(rows[0]!.completionTokens).toBeLessThan(LONG / 2)
    expect(t.nodes[0]!.stats().aborted).toBe(1)
    socket.destroy()
  } finally {
    await t.stop()
  }
}, 30_000)
