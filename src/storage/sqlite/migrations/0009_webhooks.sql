CREATE TABLE `webhook_events` (
	`webhook_id` text NOT NULL,
	`event_id` text NOT NULL,
	`org_id` text NOT NULL,
	`type` text NOT NULL,
	`payload` text NOT NULL,
	`created_at_ms` integer NOT NULL,
	`status` text NOT NULL,
	`attempts` integer DEFAULT 0 NOT NULL,
	`next_attempt_at_ms` integer NOT NULL,
	`lease_until_ms` integer,
	`delivered_at_ms` integer,
	`last_error` text,
	`last_status` integer,
	PRIMARY KEY(`webhook_id`, `event_id`)
);
--> statement-breakpoint
CREATE INDEX `webhook_events_due` ON `webhook_events` (`status`,`next_attempt_at_ms`);--> statement-breakpoint
CREATE INDEX `webhook_events_created` ON `webhook_events` (`webhook_id`,`created_at_ms`);--> statement-breakpoint
CREATE TABLE `webhooks` (
	`id` text PRIMARY KEY NOT NULL,
	`org_id` text NOT NULL,
	`url` text NOT NULL,
	`secret` text NOT NULL,
	`events` text NOT NULL,
	`balance_threshold_nano` integer,
	`enabled` integer DEFAULT 1 NOT NULL,
	`balance_below` integer DEFAULT 0 NOT NULL,
	`created_at` integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX `webhooks_org` ON `webhooks` (`org_id`,`id`);