-- Rules the bridge serves to plugins (rules_from), in the plugin's rule
-- model: each column is a field of a rule object of the plugin's
-- configuration (docs/bridge.md, Policy store, maps them).
CREATE TABLE sluice_rules (
    name        text        PRIMARY KEY,
    scope       text        NOT NULL DEFAULT 'user',
    algorithm   text        NOT NULL DEFAULT 'sliding_window',
    limit_count bigint      NOT NULL CHECK (limit_count BETWEEN 1 AND 1099511627776),
    window_ms   bigint      NOT NULL CHECK (window_ms BETWEEN 1 AND 31622400000),
    burst       bigint      CHECK (burst BETWEEN 1 AND 1099511627776),
    cost        bigint      NOT NULL DEFAULT 1,
    paths       text[]      NOT NULL DEFAULT '{}',
    methods     text[]      NOT NULL DEFAULT '{}',
    hosts       text[]      NOT NULL DEFAULT '{}',
    headers     jsonb,
    penalty     jsonb,
    action      text        NOT NULL DEFAULT 'reject',
    priority    integer     NOT NULL DEFAULT 100,
    enabled     boolean     NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text        NOT NULL
);
