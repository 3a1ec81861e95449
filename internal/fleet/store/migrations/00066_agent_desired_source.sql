-- +goose Up
-- Where an agent's desired config came from (internal/fleet/store
-- writeDesired records it with every write): desired_source is 'revision'
-- (desired_config_name, desired_revision; desired_rollout_id is the rollout
-- that sent it, NULL for the assignment of a new agent), 'direct' (PUT
-- /api/v1/agents/{uid}/config; desired_by names the token), or '' (none, or
-- cleared). desired_config_at is when it was written.
ALTER TABLE agents
    ADD COLUMN desired_source text NOT NULL DEFAULT '' CHECK (desired_source IN ('', 'revision', 'direct')),
    ADD COLUMN desired_rollout_id bigint,
    ADD COLUMN desired_by text NOT NULL DEFAULT '';

-- Before this migration a direct push kept the name and revision of the
-- revision it replaced: an agent runs a revision only while its desired
-- config is that revision's content. Its rollout is the newest intent that
-- sent it that revision.
UPDATE agents a SET desired_source = 'revision',
    desired_rollout_id = (SELECT i.rollout_id FROM rollout_intents i
        WHERE i.instance_uid = a.instance_uid AND i.config = a.desired_config_name AND i.revision = a.desired_revision
        ORDER BY i.id DESC LIMIT 1)
    WHERE a.desired_revision > 0 AND EXISTS (SELECT 1 FROM config_revisions r
        WHERE r.config = a.desired_config_name AND r.revision = a.desired_revision AND r.hash = a.desired_config_hash);
UPDATE agents a SET desired_by = r.created_by FROM rollouts r WHERE r.id = a.desired_rollout_id;
UPDATE agents SET desired_source = CASE WHEN desired_config <> '' THEN 'direct' ELSE '' END,
    desired_config_name = '', desired_revision = 0
    WHERE desired_source = '' AND desired_config_hash <> '';

-- +goose Down
ALTER TABLE agents DROP COLUMN desired_source, DROP COLUMN desired_rollout_id, DROP COLUMN desired_by;
