CREATE TABLE `usage_hours_by_key` (
	`org_id` text NOT NULL,
	`hour_start` integer NOT NULL,
	`key_id` text DEFAULT '' NOT NULL,
	`requests` integer DEFAULT 0 NOT NULL,
	`prompt_tokens` integer DEFAULT 0 NOT NULL,
	`completion_tokens` integer DEFAULT 0 NOT NULL,
	`cached_tokens` integer DEFAULT 0 NOT NULL,
	`cost_nano` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`org_id`, `hour_start`, `key_id`)
) WITHOUT ROWID;
--> statement-breakpoint
CREATE TABLE `usage_hours_by_model` (
	`org_id` text NOT NULL,
	`hour_start` integer NOT NULL,
	`model` text DEFAULT '' NOT NULL,
	`requests` integer DEFAULT 0 NOT NULL,
	`prompt_tokens` integer DEFAULT 0 NOT NULL,
	`completion_tokens` integer DEFAULT 0 NOT NULL,
	`cached_tokens` integer DEFAULT 0 NOT NULL,
	`cost_nano` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`org_id`, `hour_start`, `model`)
) WITHOUT ROWID;--> statement-breakpoint
-- The sums of the hours already kept (a store written before this migration).
INSERT INTO `usage_hours_by_model` (`org_id`, `hour_start`, `model`, `requests`, `prompt_tokens`, `completion_tokens`, `cached_tokens`, `cost_nano`)
SELECT `org_id`, `hour_start`, `model`, sum(`requests`), sum(`prompt_tokens`), sum(`completion_tokens`), sum(`cached_tokens`), sum(`cost_nano`)
FROM `usage_hours` GROUP BY `org_id`, `hour_start`, `model`;--> statement-breakpoint
INSERT INTO `usage_hours_by_key` (`org_id`, `hour_start`, `key_id`, `requests`, `prompt_tokens`, `completion_tokens`, `cached_tokens`, `cost_nano`)
SELECT `org_id`, `hour_start`, `key_id`, sum(`requests`), sum(`prompt_tokens`), sum(`completion_tokens`), sum(`cached_tokens`), sum(`cost_nano`)
FROM `usage_hours` GROUP BY `org_id`, `hour_start`, `key_id`;
