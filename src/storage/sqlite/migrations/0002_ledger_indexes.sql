DROP INDEX `ledger_key`;--> statement-breakpoint
CREATE INDEX `ledger_batch` ON `ledger` (`batch_id`) WHERE "ledger"."batch_id" IS NOT NULL;