CREATE TABLE `ledger_notes` (
	`request_id` text PRIMARY KEY NOT NULL,
	`reason` text NOT NULL
);
