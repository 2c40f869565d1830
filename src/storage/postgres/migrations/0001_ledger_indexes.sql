DROP INDEX "ledger_key";--> statement-breakpoint
DROP INDEX "ledger_batch";--> statement-breakpoint
CREATE INDEX "ledger_batch" ON "ledger" USING btree ("batch_id") WHERE "ledger"."batch_id" IS NOT NULL;