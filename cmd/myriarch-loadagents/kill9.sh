#!/usr/bin/env bash
# Failover measurement of myriarchd: two replicas on one PostgreSQL, N agents
# (opamp-go WebSocket clients) connected through two TCP balancers that
# spread them over both replicas, then kill -9 of replica B (which holds
# about half of them). Prints JSON lines; the last one, all_on_survivor,
# is the time from the kill until every agent is online on replica A in
# the database.
#
#   cmd/myriarch-loadagents/kill9.sh [N] [follower|leader]   (default 10000 follower)
#
# "leader" kills the replica that leads instead (replica A, started first)
# and also reports when the survivor leads.
#
# File descriptors: the agents process holds N, each balancer N (half of
# the agents, two ends each); the hard limit here is 20,000 per process.
set -euo pipefail
N=${1:-10000}
WHO=${2:-follower}
W=$(mktemp -d /tmp/myriarch-kill9-XXXX)
chmod 755 "$W" # the PostgreSQL of --dev runs as the postgres user when we are root
cd "$(dirname "$0")/../.."
go build -o "$W/myriarchd" ./cmd/myriarchd
go build -o "$W/loadagents" ./cmd/myriarch-loadagents
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # After a kill -9 of replica A its private PostgreSQL keeps running.
  if [ -f "$W/dev/pg/data/postmaster.pid" ]; then
    PGBIN=$(dirname "$(ls /usr/lib/postgresql/*/bin/pg_ctl | tail -1)")
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$W/dev/pg/data" -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$W"
}
trap cleanup EXIT

export MYRIARCH_LOG_LEVEL=warn
# N new agents enroll at 500/s from one address: above the default
# server.enrollmentsPerMinute (600), which guards against a leaked secret.
export MYRIARCH_SERVER_ENROLLMENTSPERMINUTE=1000000
MYRIARCH_HA_REPLICAID=replica-a MYRIARCH_SERVER_HTTPLISTEN=127.0.0.1:18081 MYRIARCH_SERVER_OPAMPLISTEN=127.0.0.1:14321 \
  "$W/myriarchd" --dev --dev-dir "$W/dev" > "$W/a.out" 2> "$W/a.err" &
A=$!
PIDS+=($A)
for _ in $(seq 100); do grep -q "PostgreSQL:" "$W/a.out" 2>/dev/null && break; sleep 0.2; done
DSN=$(grep PostgreSQL: "$W/a.out" | awk '{print $2}')
SECRET=$(cat "$W/dev/enrollment-secret")
MYRIARCH_HA_REPLICAID=replica-b MYRIARCH_SERVER_HTTPLISTEN=127.0.0.1:18082 MYRIARCH_SERVER_OPAMPLISTEN=127.0.0.1:14322 \
  MYRIARCH_DATABASE_URL="$DSN" MYRIARCH_SERVER_ENROLLMENTSECRET="$SECRET" "$W/myriarchd" serve > "$W/b.out" 2> "$W/b.err" &
B=$!
PIDS+=($B)
sleep 2
"$W/loadagents" proxy --listen 127.0.0.1:14401 --backends 127.0.0.1:14321,127.0.0.1:14322 > "$W/p1.out" &
PIDS+=($!)
"$W/loadagents" proxy --listen 127.0.0.1:14402 --backends 127.0.0.1:14322,127.0.0.1:14321 > "$W/p2.out" &
PIDS+=($!)
sleep 1
"$W/loadagents" agents --url ws://127.0.0.1:14401/v1/opamp,ws://127.0.0.1:14402/v1/opamp --secret "$SECRET" \
  --agents "$N" --rate 500 --dsn "$DSN" --hold 600s --every 30s > "$W/agents.out" 2> "$W/agents.err" &
AG=$!
PIDS+=($AG)
for _ in $(seq 600); do grep -q '"event":"connected"' "$W/agents.out" 2>/dev/null && break; sleep 1; done
head -1 "$W/agents.out"
sleep 5
if [ "$WHO" = leader ]; then VICTIM=$A; VNAME=replica-a; SURV=replica-b; FLAGS=--leader; else VICTIM=$B; VNAME=replica-b; SURV=replica-a; FLAGS=; fi
T0=$(date +%s.%N)
kill -9 "$VICTIM"
echo "{\"event\":\"killed\",\"replica\":\"$VNAME\",\"at_unix\":$T0}"
"$W/loadagents" wait --dsn "$DSN" --agents "$N" --replica "$SURV" --since "$T0" $FLAGS
kill "$AG" 2>/dev/null || true
