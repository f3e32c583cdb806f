-- The policy's version: one row, bumped in the transaction of every
-- change, so bridges notice changes by comparing one number. Bumping it
-- also serializes changes. store_id tells this database from another
-- whose versions count from 0 again.
CREATE TABLE sluice_policy (
    id       boolean PRIMARY KEY DEFAULT true CHECK (id),
    store_id text    NOT NULL DEFAULT gen_random_uuid()::text,
    version  bigint  NOT NULL DEFAULT 0
);
INSERT INTO sluice_policy DEFAULT VALUES;

-- Per-user overrides (PUT /v1/rate-limit/config): they replace the spec
-- of the per-user limits of checks for one user on one endpoint, or on
-- every endpoint ('*').
CREATE TABLE sluice_overrides (
    user_id     text        NOT NULL,
    endpoint    text        NOT NULL,
    algorithm   text        NOT NULL,
    limit_count bigint      NOT NULL CHECK (limit_count BETWEEN 1 AND 1099511627776),
    window_ms   bigint      NOT NULL CHECK (window_ms BETWEEN 1 AND 31622400000),
    burst       bigint      CHECK (burst BETWEEN 1 AND 1099511627776),
    updated_at  timestamptz NOT NULL,
    updated_by  text        NOT NULL,
    PRIMARY KEY (user_id, endpoint)
);

-- Every change, written in the change's own transaction. Append-only: the
-- triggers below refuse updates, deletes and truncation.
CREATE TABLE sluice_audit (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    who        text        NOT NULL,
    remote     text        NOT NULL,
    request_id text        NOT NULL,
    action     text        NOT NULL,
    target     text        NOT NULL,
    before     jsonb,
    after      jsonb,
    version    bigint      NOT NULL
);
CREATE INDEX sluice_audit_at ON sluice_audit (at);
CREATE INDEX sluice_audit_target ON sluice_audit (target, id);

CREATE FUNCTION sluice_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'sluice_audit is append-only';
END
$$;
CREATE TRIGGER sluice_audit_no_change BEFORE UPDATE OR DELETE ON sluice_audit
    FOR EACH ROW EXECUTE FUNCTION sluice_audit_append_only();
CREATE TRIGGER sluice_audit_no_truncate BEFORE TRUNCATE ON sluice_audit
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_audit_append_only();
