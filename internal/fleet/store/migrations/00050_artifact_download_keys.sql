-- +goose Up
-- HMAC keys of the artifact download tokens (internal/fleet/artifacts,
-- tokens.go). Every replica signs and checks the tokens with these rows, so
-- a token issued in an offer by one replica is accepted by all. The newest
-- key signs; an older one still verifies the tokens it signed until they
-- expire, then it is deleted.
CREATE TABLE artifact_download_keys (
    id         bigint PRIMARY KEY,
    key        bytea NOT NULL CHECK (length(key) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE artifact_download_keys;
