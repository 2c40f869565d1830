CREATE TABLE "receipt_keys" (
	"kid" text PRIMARY KEY NOT NULL,
	"generation" integer NOT NULL,
	"public_key" text NOT NULL,
	"private_key" text NOT NULL,
	"created_at" integer NOT NULL
);
--> statement-breakpoint
ALTER TABLE "ledger" ADD COLUMN "receipt_kid" text;--> statement-breakpoint
CREATE UNIQUE INDEX "receipt_keys_generation" ON "receipt_keys" USING btree ("generation");