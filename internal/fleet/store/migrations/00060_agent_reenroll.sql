-- +goose Up
-- Re-enrollment (internal/fleet/store/security.go AllowReenroll): the
-- enrollment secret never re-issues a credential for an instance UID that
-- holds one, unless an admin allowed it for that agent. The allowance is
-- used up by the enrollment it allows.
ALTER TABLE agent_credentials
    ADD COLUMN reenroll_allowed_at timestamptz,
    ADD COLUMN reenroll_allowed_by text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE agent_credentials DROP COLUMN reenroll_allowed_at, DROP COLUMN reenroll_allowed_by;
