import { Elysia, t } from 'elysia'
import { modelNotAllowed } from '../../errors.ts'
import type { Services } from '../../services.ts'
import { authenticate, requireReader } from '../auth.ts'

export const modelRoutes = (svc: Services) =>
  new Elysia()
    .derive(authenticate(svc))
    .get(
      '/v1/models',
      ({ principal }) => {
        requireReader(principal)
        const all = svc.deps.catalogue.list()
        // An API key with `models` sees only the models it may use.
        const key = principal.kind === 'api' ? principal.key : undefined
        return { object: 'list', data: key?.models ? all.filter((m) => key.allows(m.id)) : all }
      },
      {
        detail: {
          tags: ['models'],
          summary: 'List models with context length and prices in roubles per token',
        },
      },
    )
    .get(
      '/v1/models/*',
      ({ principal, params }) => {
        requireReader(principal)
        // Model ids contain a slash (<provider>/<model_name>), so the path is a wildcard.
        let id = params['*']
        try {
          id = decodeURIComponent(id)
        } catch {
          // not valid percent-encoding: no model has such an id
        }
        const view = svc.deps.catalogue.view(id)
        if (principal.kind === 'api' && !principal.key.allows(view.id)) throw modelNotAllowed(view.id)
        return view
      },
      { params: t.Object({ '*': t.String() }), detail: { tags: ['models'], summary: 'One model' } },
    )
