-- A rule's conditions on query parameters (docs/config.md, match.query),
-- in the form of its header conditions; null: none.
ALTER TABLE sluice_rules ADD COLUMN query jsonb;
