-- +goose Up
-- The last-seen flush (internal/fleet/lastseen, Store.FlushSeen) updates
-- last_seen of every agent heard since the previous flush: at 100,000
-- agents with 30 s heartbeats, 3,300 rows a second. agents_status indexed
-- last_seen, so none of these updates could be HOT: each wrote a new
-- entry in every index of agents (primary key, status, replica, the GIN
-- of the attributes, the bridge and role indexes). The offline sweep and
-- the counts need status; the sweep filters last_seen on the online rows
-- it finds by status. fillfactor 80 leaves room on each page for the new
-- row versions that a HOT update writes beside the old ones.
DROP INDEX agents_status;
CREATE INDEX agents_status ON agents (status);
ALTER TABLE agents SET (fillfactor = 80);

-- +goose Down
DROP INDEX agents_status;
CREATE INDEX agents_status ON agents (status, last_seen);
ALTER TABLE agents RESET (fillfactor);
