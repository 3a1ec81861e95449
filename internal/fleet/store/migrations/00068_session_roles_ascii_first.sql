-- +goose Up
-- myriarch_session_roles (00067) split a status at \s, whose meaning
-- follows the database's locale (glibc: U+2003 is a space, U+00A0 is not),
-- while the Go twin (store.BridgeSessions) split at every Unicode space:
-- an agent reporting "role=standby<U+00A0>x" was a standby on its page and
-- in a rollout's plan but not in ?role=standby. Both now split at ASCII
-- white space only (the bridge writes single spaces) and take the first
-- role= of a status, as regexp_match does.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION myriarch_session_roles(health jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT s.role ORDER BY s.role), '{}')
    FROM (SELECT (regexp_match(c.value->>'status', '(?:^|[ \t\n\r\f\v])role=([^ \t\n\r\f\v]+)'))[1] AS role
          FROM jsonb_each(CASE WHEN jsonb_typeof(health->'components') = 'object' THEN health->'components' ELSE '{}' END) AS c
          WHERE starts_with(c.key, 'session/')) s
    WHERE s.role IS NOT NULL
$$;
-- +goose StatementEnd
UPDATE agents SET session_roles = myriarch_session_roles(health) WHERE health IS NOT NULL;

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION myriarch_session_roles(health jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT s.role ORDER BY s.role), '{}')
    FROM (SELECT (regexp_match(c.value->>'status', '(?:^|\s)role=(\S+)'))[1] AS role
          FROM jsonb_each(CASE WHEN jsonb_typeof(health->'components') = 'object' THEN health->'components' ELSE '{}' END) AS c
          WHERE starts_with(c.key, 'session/')) s
    WHERE s.role IS NOT NULL
$$;
-- +goose StatementEnd
UPDATE agents SET session_roles = myriarch_session_roles(health) WHERE health IS NOT NULL;
