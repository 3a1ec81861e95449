-- +goose Up
-- The agents list filters bridges by bridge id and by session role
-- (internal/fleet/store Filter.BridgeID, Filter.Role) in SQL, with an
-- index each, so that a page of a large fleet never loads every row.
--
-- myriarch_session_roles is the SQL twin of store.BridgeSessions/Roles:
-- the distinct, sorted, non-empty "role=" values of the health components
-- named "session/<id>", whose status is space-separated key=value pairs
-- (the bridge's opamp.SessionStatusText).
-- +goose StatementBegin
CREATE FUNCTION myriarch_session_roles(health jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT s.role ORDER BY s.role), '{}')
    FROM (SELECT (regexp_match(c.value->>'status', '(?:^|\s)role=(\S+)'))[1] AS role
          FROM jsonb_each(CASE WHEN jsonb_typeof(health->'components') = 'object' THEN health->'components' ELSE '{}' END) AS c
          WHERE starts_with(c.key, 'session/')) s
    WHERE s.role IS NOT NULL
$$;
-- +goose StatementEnd

-- session_roles is kept by a trigger that runs only when health is
-- written, not with every last-seen flush (a generated column would parse
-- the health of every agent on every heartbeat batch).
ALTER TABLE agents ADD COLUMN session_roles text[] NOT NULL DEFAULT '{}';
-- +goose StatementBegin
CREATE FUNCTION myriarch_agents_session_roles() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.session_roles := myriarch_session_roles(NEW.health);
    RETURN NEW;
END $$;
-- +goose StatementEnd
CREATE TRIGGER agents_session_roles BEFORE INSERT OR UPDATE OF health ON agents
    FOR EACH ROW EXECUTE FUNCTION myriarch_agents_session_roles();
UPDATE agents SET session_roles = myriarch_session_roles(health) WHERE health IS NOT NULL;
-- The list pages by instance uid: each filter has a btree index in uid
-- order, so that a page reads only its own rows wherever the matching
-- agents lie in uid order (a GIN index on the roles let the planner walk
-- the primary key past every other agent: 58 ms for a page of owners among
-- 100,000 agents, whose bridges came last). One partial index per role of
-- store.SessionRoles; the filter names the role as a constant.
CREATE INDEX agents_role_owner ON agents (instance_uid) WHERE session_roles @> '{owner}';
CREATE INDEX agents_role_standby ON agents (instance_uid) WHERE session_roles @> '{standby}';
CREATE INDEX agents_role_active ON agents (instance_uid) WHERE session_roles @> '{active}';
CREATE INDEX agents_role_stopped ON agents (instance_uid) WHERE session_roles @> '{stopped}';
CREATE INDEX agents_bridge_id ON agents ((non_identifying->>'myriarch.bridge.id'), instance_uid);

-- +goose Down
DROP INDEX agents_bridge_id;
DROP INDEX agents_role_owner, agents_role_standby, agents_role_active, agents_role_stopped;
DROP TRIGGER agents_session_roles ON agents;
DROP FUNCTION myriarch_agents_session_roles();
ALTER TABLE agents DROP COLUMN session_roles;
DROP FUNCTION myriarch_session_roles(jsonb);
