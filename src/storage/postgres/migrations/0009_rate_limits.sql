ALTER TABLE "keys" ADD COLUMN "max_concurrency" integer;--> statement-breakpoint
ALTER TABLE "orgs" ADD COLUMN "rpm_limit" integer;--> statement-breakpoint
ALTER TABLE "orgs" ADD COLUMN "tpm_limit" integer;--> statement-breakpoint
ALTER TABLE "orgs" ADD COLUMN "model_limits" text;