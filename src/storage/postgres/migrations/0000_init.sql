CREATE TABLE "batch_lines" (
	"batch_id" text NOT NULL,
	"line" integer NOT NULL,
	"custom_id" text NOT NULL,
	"body" text NOT NULL,
	"status" text NOT NULL,
	"attempts" integer DEFAULT 0 NOT NULL,
	"not_before_ms" bigint DEFAULT 0 NOT NULL,
	"lease_until_ms" bigint,
	"result" text,
	"cost_nano" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "batch_lines_batch_id_line_pk" PRIMARY KEY("batch_id","line")
);
--> statement-breakpoint
CREATE TABLE "batches" (
	"id" text PRIMARY KEY NOT NULL,
	"org_id" text NOT NULL,
	"key_id" text NOT NULL,
	"endpoint" text NOT NULL,
	"input_file_id" text NOT NULL,
	"completion_window" text NOT NULL,
	"status" text NOT NULL,
	"output_file_id" text,
	"error_file_id" text,
	"errors" text,
	"metadata" text,
	"total" integer DEFAULT 0 NOT NULL,
	"completed" integer DEFAULT 0 NOT NULL,
	"failed" integer DEFAULT 0 NOT NULL,
	"cost_nano" bigint DEFAULT 0 NOT NULL,
	"created_at" integer NOT NULL,
	"expires_at" integer NOT NULL,
	"in_progress_at" integer,
	"finalizing_at" integer,
	"completed_at" integer,
	"failed_at" integer,
	"expired_at" integer,
	"cancelling_at" integer,
	"cancelled_at" integer
);
--> statement-breakpoint
CREATE TABLE "files" (
	"id" text PRIMARY KEY NOT NULL,
	"org_id" text NOT NULL,
	"filename" text NOT NULL,
	"purpose" text NOT NULL,
	"bytes" bigint NOT NULL,
	"lines" integer NOT NULL,
	"created_at" integer NOT NULL,
	"deleted_at" integer
);
--> statement-breakpoint
CREATE TABLE "keys" (
	"id" text PRIMARY KEY NOT NULL,
	"org_id" text NOT NULL,
	"kind" text NOT NULL,
	"name" text NOT NULL,
	"secret_hash" text NOT NULL,
	"hint" text NOT NULL,
	"limit_nano" bigint,
	"spent_nano" bigint DEFAULT 0 NOT NULL,
	"status" text NOT NULL,
	"created_at" integer NOT NULL,
	"last_used_at" integer,
	"revoked_at" integer,
	"rpm_limit" integer,
	"tpm_limit" integer
);
--> statement-breakpoint
CREATE TABLE "ledger" (
	"request_id" text PRIMARY KEY NOT NULL,
	"kind" text NOT NULL,
	"org_id" text NOT NULL,
	"key_id" text,
	"model" text,
	"node" text,
	"prompt_tokens" integer DEFAULT 0 NOT NULL,
	"completion_tokens" integer DEFAULT 0 NOT NULL,
	"cost_nano" bigint NOT NULL,
	"batch_id" text,
	"started_at_ms" bigint NOT NULL,
	"ended_at_ms" bigint NOT NULL,
	"outcome" text NOT NULL,
	"estimated" integer DEFAULT 0 NOT NULL
);
--> statement-breakpoint
CREATE TABLE "meta" (
	"key" text PRIMARY KEY NOT NULL,
	"value" text NOT NULL
);
--> statement-breakpoint
CREATE TABLE "orgs" (
	"id" text PRIMARY KEY NOT NULL,
	"name" text NOT NULL,
	"balance_nano" bigint DEFAULT 0 NOT NULL,
	"created_at" integer NOT NULL,
	CONSTRAINT "orgs_name_unique" UNIQUE("name")
);
--> statement-breakpoint
ALTER TABLE "keys" ADD CONSTRAINT "keys_org_id_orgs_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."orgs"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "batch_lines_status" ON "batch_lines" USING btree ("batch_id","status");--> statement-breakpoint
CREATE INDEX "batches_org" ON "batches" USING btree ("org_id","id");--> statement-breakpoint
CREATE INDEX "batches_status" ON "batches" USING btree ("status");--> statement-breakpoint
CREATE INDEX "files_org" ON "files" USING btree ("org_id","id");--> statement-breakpoint
CREATE UNIQUE INDEX "keys_secret_hash" ON "keys" USING btree ("secret_hash");--> statement-breakpoint
CREATE INDEX "keys_org" ON "keys" USING btree ("org_id","kind","id");--> statement-breakpoint
CREATE INDEX "ledger_org_time" ON "ledger" USING btree ("org_id","ended_at_ms");--> statement-breakpoint
CREATE INDEX "ledger_key" ON "ledger" USING btree ("key_id");--> statement-breakpoint
CREATE INDEX "ledger_batch" ON "ledger" USING btree ("batch_id");