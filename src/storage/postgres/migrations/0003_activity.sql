CREATE TABLE "usage_hours" (
	"org_id" text NOT NULL,
	"hour_start" bigint NOT NULL,
	"key_id" text DEFAULT '' NOT NULL,
	"model" text DEFAULT '' NOT NULL,
	"requests" bigint DEFAULT 0 NOT NULL,
	"prompt_tokens" bigint DEFAULT 0 NOT NULL,
	"completion_tokens" bigint DEFAULT 0 NOT NULL,
	"cached_tokens" bigint DEFAULT 0 NOT NULL,
	"cost_nano" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "usage_hours_org_id_hour_start_key_id_model_pk" PRIMARY KEY("org_id","hour_start","key_id","model")
);
--> statement-breakpoint
DROP INDEX "ledger_org_time";--> statement-breakpoint
ALTER TABLE "ledger" ADD COLUMN "cached_tokens" integer;--> statement-breakpoint
ALTER TABLE "ledger" ADD COLUMN "ttft_ms" integer;--> statement-breakpoint
CREATE INDEX "ledger_org_time" ON "ledger" USING btree ("org_id","ended_at_ms","kind","key_id","model","outcome");--> statement-breakpoint
-- Hand-added: the hours of the usage already in the ledger (the writes keep them from here on).
INSERT INTO "usage_hours" ("org_id", "hour_start", "key_id", "model", "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_nano")
SELECT "org_id", ("ended_at_ms" / 3600000) * 3600, coalesce("key_id", ''), coalesce("model", ''), count(*), sum("prompt_tokens"), sum("completion_tokens"), 0, sum("cost_nano")
FROM "ledger" WHERE "kind" = 'usage' GROUP BY 1, 2, 3, 4;
