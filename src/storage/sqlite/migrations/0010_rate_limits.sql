ALTER TABLE `keys` ADD `max_concurrency` integer;--> statement-breakpoint
ALTER TABLE `orgs` ADD `rpm_limit` integer;--> statement-breakpoint
ALTER TABLE `orgs` ADD `tpm_limit` integer;--> statement-breakpoint
ALTER TABLE `orgs` ADD `model_limits` text;