-- Agents' own metrics (internal/fleet/telemetry owns the SQL): one row per
-- agent, tier and time bucket, the value of every series the agent sent in
-- that bucket (the last one: cumulative counters and gauges), keyed
-- "name|component". Tier 0 is telemetry.fineResolution kept for
-- telemetry.fineRetention, tier 1 telemetry.coarseResolution kept for
-- telemetry.coarseRetention. fleet_telemetry holds the fleet-wide sums the
-- leader's telemetry job computes per coarse bucket.

-- +goose Up
CREATE TABLE agent_telemetry (
    instance_uid text     NOT NULL,
    tier         smallint NOT NULL,
    bucket       bigint   NOT NULL,
    series       jsonb    NOT NULL,
    PRIMARY KEY (instance_uid, tier, bucket)
);
CREATE INDEX agent_telemetry_tier_bucket ON agent_telemetry (tier, bucket);

CREATE TABLE fleet_telemetry (
    bucket bigint           NOT NULL,
    name   text             NOT NULL,
    value  double precision NOT NULL,
    PRIMARY KEY (bucket, name)
);

-- +goose Down
DROP TABLE fleet_telemetry;
DROP TABLE agent_telemetry;
