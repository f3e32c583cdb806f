-- A throttle rule's max_delay in ms (docs/config.md, throttle); null for
-- rules of other actions.
ALTER TABLE sluice_rules ADD COLUMN max_delay_ms bigint CHECK (max_delay_ms BETWEEN 1 AND 30000);
