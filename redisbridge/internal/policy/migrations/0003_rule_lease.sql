-- A rule's lease (docs/config.md, lease), as written, like its penalty.
ALTER TABLE sluice_rules ADD COLUMN lease jsonb;
