-- +goose Up
-- Roles of API tokens. Tokens created before roles existed keep what they
-- could do: everything.
ALTER TABLE api_tokens ADD COLUMN role text NOT NULL DEFAULT 'admin'
    CHECK (role IN ('viewer', 'operator', 'admin'));

-- UI login sessions: the browser holds only a random session id; the row
-- stores its SHA-256 hash, the token it was opened with and its expiry.
CREATE TABLE ui_sessions (
    hash       bytea PRIMARY KEY,
    token_id   bigint NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX ui_sessions_expiry ON ui_sessions (expires_at);

-- Per-agent OpAMP credentials, bound to one instance UID, stored hashed.
-- A revoked row stays: the UID can neither connect nor enroll again.
CREATE TABLE agent_credentials (
    instance_uid text PRIMARY KEY,
    hash         bytea UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    rotated_at   timestamptz,
    rotate_requested_at timestamptz,
    revoked_at   timestamptz,
    revoked_by   text NOT NULL DEFAULT ''
);

-- +goose Down
DROP TABLE agent_credentials;
DROP TABLE ui_sessions;
ALTER TABLE api_tokens DROP COLUMN role;
