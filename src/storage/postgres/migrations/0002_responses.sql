CREATE TABLE "responses" (
	"id" text PRIMARY KEY NOT NULL,
	"org_id" text NOT NULL,
	"conversation" text NOT NULL,
	"response" text NOT NULL,
	"created_at" integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX "responses_org" ON "responses" USING btree ("org_id","id");--> statement-breakpoint
CREATE INDEX "responses_created" ON "responses" USING btree ("created_at");