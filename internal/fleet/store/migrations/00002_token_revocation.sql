-- +goose Up
-- A revoked token keeps its row (listed as revoked, with who revoked it);
-- VerifyToken accepts only rows without revoked_at.
ALTER TABLE api_tokens ADD COLUMN revoked_at timestamptz;
ALTER TABLE api_tokens ADD COLUMN revoked_by text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE api_tokens DROP COLUMN revoked_by;
ALTER TABLE api_tokens DROP COLUMN revoked_at;
