import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { ApiError, FinishReason, FunctionCallingConfigMode, GoogleGenAI, Type } from '@google/genai'
import { type SimNode, startSimNode } from '../../src/simulator/index.ts'

// The simulated Gemini front, checked with Google's own SDK as its client: what @google/genai
// sends and accepts, not only what Tropa's adapter expects.

const KEY = 'AIzaSyDsim-0123456789abcdefghijklmnopq'
let node: SimNode
let ai: GoogleGenAI

beforeAll(async () => {
  node = await startSimNode({ name: 'gem', timeScale: 0, seed: 7, protocol: 'gemini' })
  ai = new GoogleGenAI({ apiKey: KEY, httpOptions: { baseUrl: node.url.replace(/\/v1$/, '') } })
})
afterAll(() => node.stop())

describe('simulated Gemini API with @google/genai', () => {
  test('generateContent: text, finish reason and usage metadata', async () => {
    const r = await ai.models.generateContent({
      model: 'gemini-sim',
      contents: 'Say hello',
      config: {
        systemInstruction: 'Be brief.',
        maxOutputTokens: 5,
        temperature: 0.2,
        stopSequences: ['END'],
      },
    })
    expect(typeof r.text).toBe('string')
    expect(r.text!.length).toBeGreaterThan(0)
    expect(r.candidates?.[0]?.finishReason).toBe(FinishReason.MAX_TOKENS)
    const u = r.usageMetadata!
    expect(u.candidatesTokenCount).toBe(5)
    expect(u.promptTokenCount).toBeGreaterThan(0)
    expect(u.totalTokenCount).toBe(u.promptTokenCount! + 5)
    expect(r.modelVersion).toBe('gemini-sim')
  })

  test('generateContent with an inline image part', async () => {
    const r = await ai.models.generateContent({
      model: 'gemini-sim',
      contents: [
        {
          role: 'user',
          parts: [{ text: 'What is this?' }, { inlineData: { mimeType: 'image/png', data: 'iVBORw0KGgo=' } }],
        },
      ],
    })
    expect(r.candidates?.[0]?.finishReason).toBe(FinishReason.STOP)
    expect(r.text!.length).toBeGreaterThan(0)
  })

  test('generateContentStream: chunks of text, the last with finishReason and usage', async () => {
    // v1beta, the version Tropa's adapter calls (the SDK defaults to v1; the front serves both)
    const beta = new GoogleGenAI({
      apiKey: KEY,
      apiVersion: 'v1beta',
      httpOptions: { baseUrl: node.url.replace(/\/v1$/, '') },
    })
    const stream = await beta.models.generateContentStream({ model: 'gemini-sim', contents: 'Tell a story' })
    let text = ''
    let chunks = 0
    let last: Awaited<ReturnType<typeof ai.models.generateContent>> | undefined
    for await (const c of stream) {
      chunks++
      text += c.text ?? ''
      last = c
    }
    expect(chunks).toBeGreaterThan(2)
    expect(text.length).toBeGreaterThan(0)
    expect(last?.candidates?.[0]?.finishReason).toBe(FinishReason.STOP)
    expect(last?.usageMetadata?.candidatesTokenCount).toBeGreaterThan(0)
    expect(last?.usageMetadata?.promptTokenCount).toBeGreaterThan(0)
  })

  test('function calling: a call, then its response answered with text', async () => {
    const tools = [
      {
        functionDeclarations: [
          {
            name: 'get_weather',
            description: 'Weather in a city',
            parameters: {
              type: Type.OBJECT,
              properties: { city: { type: Type.STRING } },
              required: ['city'],
            },
          },
        ],
      },
    ]
    const r = await ai.models.generateContent({
      model: 'gemini-sim',
      contents: 'Weather in Paris?',
      config: {
        tools,
        toolConfig: {
          functionCallingConfig: {
            mode: FunctionCallingConfigMode.ANY,
            allowedFunctionNames: ['get_weather'],
          },
        },
      },
    })
    const calls = r.functionCalls!
    expect(calls).toHaveLength(1)
    expect(calls[0]!.name).toBe('get_weather')
    expect(calls[0]!.args).toEqual({ city: 'sim' })
    const r2 = await ai.models.generateContent({
      model: 'gemini-sim',
      contents: [
        { role: 'user', parts: [{ text: 'Weather in Paris?' }] },
        { role: 'model', parts: [{ functionCall: { name: 'get_weather', args: { city: 'Paris' } } }] },
        {
          role: 'user',
          parts: [{ functionResponse: { name: 'get_weather', response: { output: 'sunny' } } }],
        },
      ],
      config: { tools },
    })
    expect(r2.functionCalls).toBeUndefined()
    expect(r2.text!.length).toBeGreaterThan(0)
  })

  test('embedContent with several contents (batchEmbedContents), with outputDimensionality', async () => {
    const r = await ai.models.embedContent({
      model: 'text-embedding-sim',
      contents: ['first text', 'second text', 'third'],
      config: { outputDimensionality: 64 },
    })
    expect(r.embeddings).toHaveLength(3)
    for (const e of r.embeddings!) expect(e.values).toHaveLength(64)
    expect(r.embeddings![0]!.values).not.toEqual(r.embeddings![1]!.values)
  })

  test('a wrong key is the SDK ApiError with status 400 (API_KEY_INVALID)', async () => {
    const bad = new GoogleGenAI({
      apiKey: 'wrong-key',
      httpOptions: { baseUrl: node.url.replace(/\/v1$/, '') },
    })
    const err = await bad.models.generateContent({ model: 'gemini-sim', contents: 'hi' }).catch((e) => e)
    expect(err).toBeInstanceOf(ApiError)
    expect((err as ApiError).status).toBe(400)
    expect((err as ApiError).message).toContain('API_KEY_INVALID')
    expect((err as ApiError).message).toContain('API key not valid')
  })

  test('a fault is Google-shaped: 503 UNAVAILABLE', async () => {
    node.setFaults({ rate503: 1 })
    try {
      const err = await ai.models
        .generateContent({
          model: 'gemini-sim',
          contents: 'hi',
          config: { httpOptions: { retryOptions: { attempts: 1 } } },
        })
        .catch((e) => e)
      expect(err).toBeInstanceOf(ApiError)
      expect((err as ApiError).status).toBe(503)
      expect((err as ApiError).message).toContain('UNAVAILABLE')
    } finally {
      node.setFaults({ rate503: 0 })
    }
  })

  test('a bad request is 400 INVALID_ARGUMENT', async () => {
    const res = await fetch(`${node.url.replace(/\/v1$/, '')}/v1beta/models/gemini-sim:generateContent`, {
      method: 'POST',
      headers: { 'x-goog-api-key': KEY, 'content-type': 'application/json' },
      body: JSON.stringify({ contents: [] }),
    })
    expect(res.status).toBe(400)
    const body = (await res.json()) as { error: { code: number; status: string; message: string } }
    expect(body.error.code).toBe(400)
    expect(body.error.status).toBe('INVALID_ARGUMENT')
  })
})
