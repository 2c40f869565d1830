ALTER TABLE `keys` ADD `budget` text;--> statement-breakpoint
ALTER TABLE `keys` ADD `end_user_budget` text;--> statement-breakpoint
ALTER TABLE `ledger` ADD `end_user` text;--> statement-breakpoint
ALTER TABLE `ledger` ADD `admitted_at_ms` integer;--> statement-breakpoint
CREATE INDEX `ledger_end_user` ON `ledger` (`org_id`,`end_user`,`ended_at_ms`) WHERE "ledger"."end_user" IS NOT NULL;--> statement-breakpoint
CREATE INDEX `ledger_admitted` ON `ledger` (`key_id`,`admitted_at_ms`,`end_user`) WHERE "ledger"."admitted_at_ms" IS NOT NULL;