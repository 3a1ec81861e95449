package store

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// The migrations of the desired config's source (00066) and of the bridge
// filters (00067) fill their columns for the rows that exist: an agent on
// a revision gets it with its rollout and creator, an agent whose revision
// a direct push replaced (the old writer kept the revision's name) gets
// "direct" and loses the revision, a cleared one none; a bridge's roles
// are read from its stored health.
func TestMigrationsFillDesiredSourceAndRoles(t *testing.T) {
	pg := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, mustSub(migrations, "migrations"),
		goose.WithTableName("myriarch_schema_version"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 60); err != nil {
		t.Fatal(err)
	}
	health := `{"healthy":true,"components":{"session/plant":{"healthy":true,"status":"mode=exclusive role=standby"}}}`
	if _, err := pool.Exec(ctx, `
		INSERT INTO configs (name, type) VALUES ('c', 'yaml');
		INSERT INTO config_revisions (config, revision, content, hash) VALUES ('c', 1, 'x: 1', 'h1');
		INSERT INTO rollouts (id, config, to_revision, spec, state, created_by) VALUES (7, 'c', 1, '{}', 'succeeded', 'token rel');
		INSERT INTO rollout_intents (rollout_id, instance_uid, config, wave, term, kind, revision, hash)
			VALUES (7, 'rev', 'c', 1, 1, 'apply', 1, 'h1');
		INSERT INTO agents (instance_uid, desired_config, desired_config_hash, desired_config_name, desired_revision, desired_config_at, health) VALUES
			('rev', 'x: 1', 'h1', 'c', 1, now(), NULL),
			('pushed', 'y: 2', 'h2', 'c', 1, now(), NULL),
			('cleared', '', 'h0', 'c', 1, now(), NULL),
			('none', '', '', '', 0, NULL, '`+health+`')`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	s := &Store{Pool: pool}
	get := func(uid string) Agent {
		t.Helper()
		a, err := s.GetAgent(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if src := get("rev").DesiredSource; src == nil || src.Kind != DesiredFromRevision || src.Config != "c" || src.Revision != 1 ||
		src.RolloutID == nil || *src.RolloutID != 7 || src.By != "token rel" {
		t.Errorf("agent on a revision: %+v", src)
	}
	if src := get("pushed").DesiredSource; src == nil || src.Kind != DesiredDirect || src.Config != "" || src.Revision != 0 || src.RolloutID != nil {
		t.Errorf("pushed agent: %+v", src)
	}
	if as, err := AgentAssignment(ctx, pool, "pushed"); err != nil || as.DesiredConfig != "" || as.DesiredRevision != 0 {
		t.Errorf("pushed agent's assignment still names the revision: %+v %v", as, err)
	}
	if src := get("cleared").DesiredSource; src != nil {
		t.Errorf("cleared agent: %+v", src)
	}
	var roles []string
	if err := pool.QueryRow(ctx, "SELECT "+SessionRolesSQL+" FROM agents WHERE instance_uid = 'none'").Scan(&roles); err != nil || !slices.Equal(roles, []string{RoleStandby}) {
		t.Errorf("roles of the bridge after the migration: %v %v", roles, err)
	}
	b, _ := json.Marshal(get("none"))
	var item struct{ Roles []string }
	if json.Unmarshal(b, &item); !slices.Equal(item.Roles, []string{RoleStandby}) {
		t.Errorf("the bridge's roles as listed: %s", b)
	}
}
