// An upstream's error message is written by software Tropa does not control, and it may carry
// what the client must not see: the upstream's API key echoed back, a token, a file path of the
// machine it runs on. What reaches the client keeps its meaning, minus those; the original goes
// to the operator's log. Runs only on error paths.

/** The longest cleaned message a client gets, in characters. */
export const MAX_MESSAGE = 300

const CREDENTIAL = '[redacted]'
const PATH = '[path]'

// Order matters: URLs' user:password first, then named secrets (whose value may be anything),
// then shapes of tokens, then paths (a token may hold slashes).
const RULES: readonly (readonly [RegExp, string])[] = [
  // scheme://user:password@host
  [/\b([a-z][a-z0-9+.-]*:\/\/)[^\s/@:]+:[^\s/@]+@/gi, `$1${CREDENTIAL}@`],
  // Authorization: Bearer abc, Basic abc, Token abc
  [/\b(Bearer|Basic|Token)\s+[^\s,;'"]+/gi, `$1 ${CREDENTIAL}`],
  // api_key=..., "token": "...", password: ..., x-api-key: ..., ?key=... (a bare `key` with = only)
  [
    /\b((?:x-)?(?:api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key|client[_-]?secret|token|access[_-]?token|refresh[_-]?token|auth|authorization|secret|password|passwd|pwd|credentials?|session|signature|sig)["']?\s*[:=]\s*|\bkey\s*=\s*)(?:"[^"]*"|'[^']*'|[^\s,;&'"]+)/gi,
    `$1${CREDENTIAL}`,
  ],
  // OpenAI-style and other prefixed keys: sk-..., sk-proj-..., pk_live_..., ghp_..., xoxb-..., AKIA...
  [/\b(?:sk|pk|rk|ak)[-_][A-Za-z0-9_-]{6,}/g, CREDENTIAL],
  [/\b(?:gh[pousr]_|github_pat_|xox[abprs]-|glpat-|hf_)[A-Za-z0-9_-]{6,}/g, CREDENTIAL],
  [/\bAKIA[0-9A-Z]{12,}/g, CREDENTIAL],
  // JWTs
  [/\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]*)?/g, CREDENTIAL],
  // long hex, or long base64 runs holding both letters and digits (not model names: a '-' ends one)
  [/\b[0-9a-fA-F]{24,}\b/g, CREDENTIAL],
  [
    /(?<![A-Za-z0-9+/_])(?=[A-Za-z0-9+/_]*\d)(?=[A-Za-z0-9+/_]*[A-Za-z])[A-Za-z0-9+/_]{24,}={0,2}/g,
    CREDENTIAL,
  ],
  // Windows paths (C:\..., C:/...) and UNC shares (\\server\share)
  [/\b[A-Za-z]:[\\/][^\s'"`,;:)]*/g, PATH],
  [/\\\\[^\s\\'"`]+\\[^\s'"`,;:)]*/g, PATH],
  // Unix paths: /srv/..., ~/..., ./..., with at least one directory (not inside a URL)
  [/(?<![\w.:/~-])(?:~|\.{1,2})?\/(?:[\w.@+-]+\/)+[\w.@+-]*/g, PATH],
  [/(?<![\w.:/~-])\/(?:srv|home|root|etc|var|opt|usr|tmp|mnt|data|app|proc|Users|private)\b/g, PATH],
]

/** The rules that remove credentials (the first seven of RULES), for text that keeps its paths. */
const CREDENTIAL_RULES = RULES.slice(0, RULES.length - 4)

/**
 * Text with every credential shape of RULES replaced by `[redacted]` (a captured request or
 * response body for the access log); nothing else changed.
 */
export function redactCredentials(text: string): string {
  for (const [re, to] of CREDENTIAL_RULES) text = text.replace(re, to)
  return text
}

/** An upstream's error message fit for the client: no credentials, no paths, one bounded line. */
export function cleanUpstreamMessage(message: string): string {
  // Bounded input first: the rules are linear, but there is no reason to run them on 64 KB.
  let text = message.length > 4 * MAX_MESSAGE ? message.slice(0, 4 * MAX_MESSAGE) : message
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it removes
  text = text.replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]+/g, ' ')
  for (const [re, to] of RULES) text = text.replace(re, to)
  text = text.replace(/\s{2,}/g, ' ').trim()
  if (text.length > MAX_MESSAGE) text = `${text.slice(0, MAX_MESSAGE - 1)}…`
  return text.length > 0 ? text : 'no message'
}

/** An upstream's `param`, when it looks like one (`messages[0].content`); null otherwise. */
export function cleanUpstreamParam(param: unknown): string | null {
  return typeof param === 'string' && /^[A-Za-z_][\w.[\]-]{0,63}$/.test(param) ? param : null
}
