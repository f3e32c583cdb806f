-- A rule charged after the response (docs/config.md, on_response): its
-- on_response object as written; null: charged before the request.
ALTER TABLE sluice_rules ADD COLUMN on_response jsonb;
