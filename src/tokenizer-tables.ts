// gpt-tokenizer's o200k_base, in a build entry of its own (package.json's `build`): the
// executable holds its 2.4 MB of tables apart from the main bundle, so a process maps and builds
// them only once something counts tokens (tokenizer.ts imports this file on first use).
export { countTokens, default as encoding, encode, setMergeCacheSize } from 'gpt-tokenizer'
export { O200K_TOKEN_SPLIT_REGEX } from 'gpt-tokenizer/encodingParams/constants'
