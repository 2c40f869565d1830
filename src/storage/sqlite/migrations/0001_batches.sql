CREATE TABLE `batch_lines` (
	`batch_id` text NOT NULL,
	`line` integer NOT NULL,
	`custom_id` text NOT NULL,
	`body` text NOT NULL,
	`status` text NOT NULL,
	`attempts` integer DEFAULT 0 NOT NULL,
	`not_before_ms` integer DEFAULT 0 NOT NULL,
	`lease_until_ms` integer,
	`result` text,
	`cost_nano` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`batch_id`, `line`)
);
--> statement-breakpoint
CREATE INDEX `batch_lines_status` ON `batch_lines` (`batch_id`,`status`);--> statement-breakpoint
CREATE TABLE `batches` (
	`id` text PRIMARY KEY NOT NULL,
	`org_id` text NOT NULL,
	`key_id` text NOT NULL,
	`endpoint` text NOT NULL,
	`input_file_id` text NOT NULL,
	`completion_window` text NOT NULL,
	`status` text NOT NULL,
	`output_file_id` text,
	`error_file_id` text,
	`errors` text,
	`metadata` text,
	`total` integer DEFAULT 0 NOT NULL,
	`completed` integer DEFAULT 0 NOT NULL,
	`failed` integer DEFAULT 0 NOT NULL,
	`cost_nano` integer DEFAULT 0 NOT NULL,
	`created_at` integer NOT NULL,
	`expires_at` integer NOT NULL,
	`in_progress_at` integer,
	`finalizing_at` integer,
	`completed_at` integer,
	`failed_at` integer,
	`expired_at` integer,
	`cancelling_at` integer,
	`cancelled_at` integer
);
--> statement-breakpoint
CREATE INDEX `batches_org` ON `batches` (`org_id`,`id`);--> statement-breakpoint
CREATE INDEX `batches_status` ON `batches` (`status`);--> statement-breakpoint
CREATE TABLE `files` (
	`id` text PRIMARY KEY NOT NULL,
	`org_id` text NOT NULL,
	`filename` text NOT NULL,
	`purpose` text NOT NULL,
	`bytes` integer NOT NULL,
	`lines` integer NOT NULL,
	`created_at` integer NOT NULL,
	`deleted_at` integer
);
--> statement-breakpoint
CREATE INDEX `files_org` ON `files` (`org_id`,`id`);