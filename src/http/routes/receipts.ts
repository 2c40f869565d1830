import { Elysia } from 'elysia'
import { NotFound } from '../../errors.ts'
import type { Services } from '../../services.ts'

export const receiptsDisabled = () =>
  new NotFound('receipts are turned off on this server (receipts.enabled)', 'receipts_disabled')

/**
 * GET /.well-known/tropa-receipts.json: the public keys receipts are verified with (a JWK set:
 * Ed25519, every key ever used, the current one named). No authentication: anyone a customer
 * shows a receipt to can check it.
 */
export const receiptRoutes = (svc: Services) =>
  new Elysia().get(
    '/.well-known/tropa-receipts.json',
    () => {
      const receipts = svc.deps.receipts
      if (!receipts) throw receiptsDisabled()
      return new Response(receipts.keySetText(), {
        headers: { 'content-type': 'application/json', 'cache-control': 'public, max-age=60' },
      })
    },
    {
      detail: {
        tags: ['usage'],
        summary: "The receipts' public keys: a JWK set (Ed25519), every key ever used, and the current kid",
      },
    },
  )
