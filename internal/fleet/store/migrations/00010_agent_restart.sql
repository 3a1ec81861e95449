-- +goose Up
-- A restart requested through the API, delivered by the replica the agent
-- is connected to (ServerToAgentCommand restart). A request older than
-- RestartRequestTTL is no longer delivered.
ALTER TABLE agents ADD COLUMN restart_requested_at timestamptz;

-- +goose Down
ALTER TABLE agents DROP COLUMN restart_requested_at;
