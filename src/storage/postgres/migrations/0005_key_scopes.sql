ALTER TABLE "keys" ADD COLUMN "expires_at" integer;--> statement-breakpoint
ALTER TABLE "keys" ADD COLUMN "models" text;