CREATE TABLE `keys` (
	`id` text PRIMARY KEY NOT NULL,
	`org_id` text NOT NULL,
	`kind` text NOT NULL,
	`name` text NOT NULL,
	`secret_hash` text NOT NULL,
	`hint` text NOT NULL,
	`limit_nano` integer,
	`spent_nano` integer DEFAULT 0 NOT NULL,
	`status` text NOT NULL,
	`created_at` integer NOT NULL,
	`last_used_at` integer,
	`revoked_at` integer,
	`rpm_limit` integer,
	`tpm_limit` integer,
	FOREIGN KEY (`org_id`) REFERENCES `orgs`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE UNIQUE INDEX `keys_secret_hash` ON `keys` (`secret_hash`);--> statement-breakpoint
CREATE INDEX `keys_org` ON `keys` (`org_id`,`kind`,`id`);--> statement-breakpoint
CREATE TABLE `ledger` (
	`request_id` text PRIMARY KEY NOT NULL,
	`kind` text NOT NULL,
	`org_id` text NOT NULL,
	`key_id` text,
	`model` text,
	`node` text,
	`prompt_tokens` integer DEFAULT 0 NOT NULL,
	`completion_tokens` integer DEFAULT 0 NOT NULL,
	`cost_nano` integer NOT NULL,
	`batch_id` text,
	`started_at_ms` integer NOT NULL,
	`ended_at_ms` integer NOT NULL,
	`outcome` text NOT NULL,
	`estimated` integer DEFAULT 0 NOT NULL
);
--> statement-breakpoint
CREATE INDEX `ledger_org_time` ON `ledger` (`org_id`,`ended_at_ms`);--> statement-breakpoint
CREATE INDEX `ledger_key` ON `ledger` (`key_id`);--> statement-breakpoint
CREATE TABLE `meta` (
	`key` text PRIMARY KEY NOT NULL,
	`value` text NOT NULL
);
--> statement-breakpoint
CREATE TABLE `orgs` (
	`id` text PRIMARY KEY NOT NULL,
	`name` text NOT NULL,
	`balance_nano` integer DEFAULT 0 NOT NULL,
	`created_at` integer NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `orgs_name_unique` ON `orgs` (`name`);