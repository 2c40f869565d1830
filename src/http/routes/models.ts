import { Elysia, t } from 'elysia'
import type { Services } from '../../services.ts'
import { authenticate, requireReader } from '../auth.ts'

export const modelRoutes = (svc: Services) =>
  new Elysia()
    .derive(authenticate(svc))
    .get(
      '/v1/models',
      ({ principal }) => {
        requireReader(principal)
        return { object: 'list', data: svc.deps.catalogue.list() }
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
        return svc.deps.catalogue.view(id)
      },
      { params: t.Object({ '*': t.String() }), detail: { tags: ['models'], summary: 'One model' } },
    )
