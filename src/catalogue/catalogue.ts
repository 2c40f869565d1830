import { formatRub } from '../billing/money.ts'
import type { ModelConfig } from '../config/load.ts'
import { InvalidValue, modelNotFound } from '../errors.ts'

/** The catalogue entry as `GET /v1/models` shows it. */
export interface ModelView {
  id: string
  object: 'model'
  created: number
  owned_by: string
  context_length: number
  pricing: { prompt: string; completion: string; cached_prompt: string }
}

/** The models Tropa serves, from the config. */
export class Catalogue {
  private byId!: Map<string, ModelConfig>
  private views!: ModelView[]

  constructor(models: readonly ModelConfig[]) {
    this.replace(models)
  }

  /**
   * The models of a reloaded config, for requests looked up from now on; a request already
   * admitted keeps the ModelConfig (its routes and price) it was looked up with.
   */
  replace(models: readonly ModelConfig[]): void {
    this.byId = new Map(models.map((m) => [m.id, m]))
    this.views = models.map(toView)
  }

  list(): readonly ModelView[] {
    return this.views
  }

  all(): readonly ModelConfig[] {
    return [...this.byId.values()]
  }

  /** The model, or 404 model_not_found. */
  get(id: string): ModelConfig {
    const m = this.byId.get(id)
    if (!m) throw modelNotFound(id)
    return m
  }

  /** The model, checked to be of the kind the endpoint serves. */
  getOfKind(id: string, kind: ModelConfig['kind']): ModelConfig {
    const m = this.get(id)
    if (m.kind !== kind)
      throw new InvalidValue(
        `${id} is ${m.kind === 'chat' ? 'a chat' : 'an embedding'} model, not usable here`,
        'model',
      )
    return m
  }

  view(id: string): ModelView {
    return toView(this.get(id))
  }
}

function toView(m: ModelConfig): ModelView {
  return {
    id: m.id,
    object: 'model',
    created: m.created,
    owned_by: m.ownedBy,
    context_length: m.contextLength,
    pricing: {
      prompt: formatRub(m.price.promptNano),
      completion: formatRub(m.price.completionNano),
      cached_prompt: formatRub(m.price.cachedPromptNano),
    },
  }
}
