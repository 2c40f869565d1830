CREATE TABLE `console_sessions` (
	`id` text PRIMARY KEY NOT NULL,
	`kind` text NOT NULL,
	`key_id` text,
	`csrf` text NOT NULL,
	`created_at` integer NOT NULL,
	`last_seen_at` integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX `console_sessions_seen` ON `console_sessions` (`last_seen_at`);