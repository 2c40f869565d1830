import { html } from 'htm/preact'
import { useRef, useState } from 'preact/hooks'
import { api, fetchAsKey } from '../api.ts'
import { num, rub, t } from '../i18n.ts'
import { useKeyPick } from '../keypick.ts'
import { ErrorBox, useLoad } from '../ui.ts'

interface Usage {
  prompt_tokens: number
  completion_tokens: number
  cost_rub?: number
}

/** A streamed chat with one of the organization's keys: the answer as it arrives, its cost and node. */
export function Playground() {
  const { keyId, picker, none } = useKeyPick()
  const models = useLoad(() => api<{ data: { id: string }[] }>('/models'))
  const [answer, setAnswer] = useState('')
  const [usage, setUsage] = useState<Usage | null>(null)
  const [node, setNode] = useState<string | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)
  const abort = useRef<AbortController | null>(null)
  const send = async (e: Event) => {
    e.preventDefault()
    if (!keyId) return
    const form = e.currentTarget as HTMLFormElement
    const model = (form.elements.namedItem('model') as HTMLSelectElement).value
    const content = (form.elements.namedItem('message') as HTMLTextAreaElement).value
    setAnswer('')
    setUsage(null)
    setNode(null)
    setError(null)
    setBusy(true)
    abort.current = new AbortController()
    try {
      const r = await fetchAsKey(
        keyId,
        '/chat/completions',
        {
          model,
          messages: [{ role: 'user', content }],
          stream: true,
          stream_options: { include_usage: true },
        },
        abort.current.signal,
      )
      setNode(r.headers.get('x-tropa-node'))
      if (!r.ok || !r.body) {
        const body = (await r.json().catch(() => null)) as { error?: { message?: string } } | null
        throw new Error(body?.error?.message ?? `HTTP ${r.status}`)
      }
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader()
      let buffer = ''
      let text = ''
      for (;;) {
        const { value, done } = await reader.read()
        if (done) break
        buffer += value
        let end = buffer.indexOf('\n\n')
        while (end >= 0) {
          const event = buffer.slice(0, end)
          buffer = buffer.slice(end + 2)
          end = buffer.indexOf('\n\n')
          const data = event
            .split('\n')
            .filter((l) => l.startsWith('data:'))
            .map((l) => l.slice(5).trim())
            .join('')
          if (!data || data === '[DONE]') continue
          const chunk = JSON.parse(data) as {
            choices?: { delta?: { content?: string } }[]
            usage?: Usage
            error?: { message: string }
          }
          if (chunk.error) throw new Error(chunk.error.message)
          text += chunk.choices?.[0]?.delta?.content ?? ''
          setAnswer(text)
          if (chunk.usage) setUsage(chunk.usage)
        }
      }
    } catch (err) {
      if (!(err instanceof DOMException && err.name === 'AbortError'))
        setError(String((err as Error).message ?? err))
    } finally {
      setBusy(false)
    }
  }
  return html`<div>
    ${none}
    <form class="play" onSubmit=${send}>
      <div class="inline">
        ${picker}
        <label>${t('play.model')}
          <select name="model">${(models.data?.data ?? []).map((m) => html`<option value=${m.id}>${m.id}</option>`)}</select>
        </label>
      </div>
      <label class="wide">${t('play.message')}
        <textarea name="message" rows="4" required></textarea>
      </label>
      <div class="row">
        <button type="submit" disabled=${busy || !keyId}>${t('play.send')}</button>
        ${busy && html`<button type="button" class="secondary" onClick=${() => abort.current?.abort()}>${t('play.stop')}</button>`}
      </div>
    </form>
    <${ErrorBox} error=${error} />
    <section aria-labelledby="answer-title" aria-busy=${busy}>
      <h2 id="answer-title">${t('play.answer')}</h2>
      <p class="answer" data-testid="answer">${answer}</p>
      <dl class="facts">
        <div><dt>${t('play.cost')}</dt><dd data-testid="cost">${usage?.cost_rub === undefined ? t('common.none') : rub(usage.cost_rub)}</dd></div>
        <div><dt>${t('play.node')}</dt><dd data-testid="node">${node ?? t('common.none')}</dd></div>
        <div><dt>${t('play.tokens')}</dt><dd>${usage ? `${num(usage.prompt_tokens)} / ${num(usage.completion_tokens)}` : t('common.none')}</dd></div>
      </dl>
    </section>
  </div>`
}
