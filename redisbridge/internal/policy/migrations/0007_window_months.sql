-- Rules and overrides whose window is calendar months (docs/config.md,
-- "1mo"): how many; 0: window_ms alone. window_ms then holds their
-- nominal length.
ALTER TABLE sluice_rules ADD COLUMN window_months smallint NOT NULL DEFAULT 0
    CHECK (window_months IN (0, 1, 2, 3, 4, 6, 12));
ALTER TABLE sluice_overrides ADD COLUMN window_months smallint NOT NULL DEFAULT 0
    CHECK (window_months IN (0, 1, 2, 3, 4, 6, 12));
