CREATE TABLE "usage_hours_by_key" (
	"org_id" text NOT NULL,
	"hour_start" bigint NOT NULL,
	"key_id" text DEFAULT '' NOT NULL,
	"requests" bigint DEFAULT 0 NOT NULL,
	"prompt_tokens" bigint DEFAULT 0 NOT NULL,
	"completion_tokens" bigint DEFAULT 0 NOT NULL,
	"cached_tokens" bigint DEFAULT 0 NOT NULL,
	"cost_nano" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "usage_hours_by_key_org_id_hour_start_key_id_pk" PRIMARY KEY("org_id","hour_start","key_id")
);
--> statement-breakpoint
CREATE TABLE "usage_hours_by_model" (
	"org_id" text NOT NULL,
	"hour_start" bigint NOT NULL,
	"model" text DEFAULT '' NOT NULL,
	"requests" bigint DEFAULT 0 NOT NULL,
	"prompt_tokens" bigint DEFAULT 0 NOT NULL,
	"completion_tokens" bigint DEFAULT 0 NOT NULL,
	"cached_tokens" bigint DEFAULT 0 NOT NULL,
	"cost_nano" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "usage_hours_by_model_org_id_hour_start_model_pk" PRIMARY KEY("org_id","hour_start","model")
);--> statement-breakpoint
-- The sums of the hours already kept (a database written before this migration).
INSERT INTO "usage_hours_by_model" ("org_id", "hour_start", "model", "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_nano")
SELECT "org_id", "hour_start", "model", sum("requests"), sum("prompt_tokens"), sum("completion_tokens"), sum("cached_tokens"), sum("cost_nano")
FROM "usage_hours" GROUP BY "org_id", "hour_start", "model";--> statement-breakpoint
INSERT INTO "usage_hours_by_key" ("org_id", "hour_start", "key_id", "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_nano")
SELECT "org_id", "hour_start", "key_id", sum("requests"), sum("prompt_tokens"), sum("completion_tokens"), sum("cached_tokens"), sum("cost_nano")
FROM "usage_hours" GROUP BY "org_id", "hour_start", "key_id";
