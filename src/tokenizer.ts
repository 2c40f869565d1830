// The tokenizer (o200k_base through gpt-tokenizer), shared by the pipeline and the simulator.
// Loading it takes a few hundred milliseconds, so nothing imports it statically: start-up stays
// fast, main.ts starts the load once the server listens, and the first user awaits it.

type Encode = (text: string) => number[]
let encodeFn: Encode | undefined
let loading: Promise<void> | undefined

export function loadTokenizer(): Promise<void> {
  loading ??= import('gpt-tokenizer').then((m) => {
    encodeFn = m.encode
  })
  return loading
}

export function tokenizerLoaded(): boolean {
  return encodeFn !== undefined
}

/** Token ids of a text; the tokenizer must have been loaded. */
export function encode(text: string): number[] {
  if (!encodeFn) throw new Error('tokenizer not loaded: await loadTokenizer() first')
  return encodeFn(text)
}
