ALTER TABLE "keys" ADD COLUMN "budget" text;--> statement-breakpoint
ALTER TABLE "keys" ADD COLUMN "end_user_budget" text;--> statement-breakpoint
ALTER TABLE "ledger" ADD COLUMN "end_user" text;--> statement-breakpoint
ALTER TABLE "ledger" ADD COLUMN "admitted_at_ms" bigint;--> statement-breakpoint
CREATE INDEX "ledger_end_user" ON "ledger" USING btree ("org_id","end_user","ended_at_ms") WHERE "ledger"."end_user" IS NOT NULL;--> statement-breakpoint
CREATE INDEX "ledger_admitted" ON "ledger" USING btree ("key_id","admitted_at_ms","end_user") WHERE "ledger"."admitted_at_ms" IS NOT NULL;