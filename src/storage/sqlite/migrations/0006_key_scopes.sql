ALTER TABLE `keys` ADD `expires_at` integer;--> statement-breakpoint
ALTER TABLE `keys` ADD `models` text;