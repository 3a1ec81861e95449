-- +goose Up
-- A package version offered to an agent (OpAMP PackagesAvailable). The
-- replica the agent is connected to delivers it; sent_conn is the
-- connection it was last sent on, so each connection gets it once.
CREATE TABLE agent_package_offers (
    instance_uid text NOT NULL,
    package      text NOT NULL,
    version      text NOT NULL,
    asset        text NOT NULL,
    digest       text NOT NULL,
    signature    text NOT NULL DEFAULT '',
    offered_at   timestamptz NOT NULL DEFAULT now(),
    offered_by   text NOT NULL DEFAULT '',
    sent_conn    text NOT NULL DEFAULT '',
    sent_at      timestamptz,
    PRIMARY KEY (instance_uid, package)
);

-- +goose Down
DROP TABLE agent_package_offers;
