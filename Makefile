# Myriarch. `make demo` runs the main job on embedded defaults; `make test` runs every check.
GO ?= go
TESTFLAGS ?=

.PHONY: demo test tidy vet staticcheck unit docs fuzz build budgets bench failover-lab otel-agent image helm proof

# The main job: two bridge processes, an embedded broker and sink, a steady
# QoS 1 publisher; kill the owner, then cut the owner's broker path, and
# print budget against measured failure-to-full, losses and duplicates.
# LAB adds lab flags, e.g. LAB="--scenarios all --store etcd" for the owner
# scenarios (SIGSTOP, store partition, unreachable broker; ~2 minutes) or
# LAB="--broker mosquitto --broker-queue-limit 1000 --rate 250".
# DEMO=fleet instead shows the bridges as agents of myriarchd: myriarchd on
# a throwaway PostgreSQL, two bridge processes, a route added and a cadence
# changed by remote configuration (the end-to-end test, verbose).
LAB ?=
DEMO ?=
demo:
ifeq ($(DEMO),fleet)
	$(GO) test -count=1 -v -run TestBridgesManagedByMyriarchd ./cmd/myriarch-bridge/
else
	GO=$(GO) tools/demo/demo.sh $(LAB)
endif

# The failover arithmetic of both daemons at their defaults.
budgets:
	$(GO) run ./cmd/myriarch-bridge budget
	$(GO) run ./cmd/myriarch-bridge budget --deployment-mode clustered --broker-health-step-down 90s
	$(GO) run ./cmd/myriarchd budget

# Leader failover scenarios of myriarchd against a throwaway PostgreSQL
# (the network-namespace scenario needs root).
failover-lab:
	$(GO) run ./cmd/myriarch-lab leader

# A proof campaign (docs/proof.md): seeded, randomized failover rounds of
# the bridge on sqlite, PostgreSQL and etcd (embedded broker and mosquitto)
# and of myriarchd's leader, each judged on its whole history. SIZE=smoke
# (~3 minutes), medium (~30 minutes), full (>= 1000 rounds per store and
# 1000 leader rounds, <= 6 hours on 2 cores). Rerun with the same SIZE
# (PROOF_DIR) to continue a stopped campaign. The last line of output is
# the campaign's JSON; the report is PROOF_DIR/index.html. PROOF adds
# flags, e.g. PROOF="--parallel 8 --seed 42".
SIZE ?= smoke
PROOF_DIR ?= proof-$(SIZE)
PROOF ?=
proof:
	@$(GO) build -o bin/ ./cmd/myriarch-bridge ./cmd/myriarch-lab
	@bin/myriarch-lab proof --size $(SIZE) --dir $(PROOF_DIR) $(PROOF)

# The anchors (docs/anchors.md): the same singleton workload and faults
# (SIGSTOP past the TTL, netns DROP of the store path, kill -9) under etcd's
# concurrency.Election, a naive PostgreSQL advisory lock, Myriarch's lease
# and pgleader; prints the table and, last, one JSON object. Needs root for
# netns-drop; about 6 minutes per repetition. ANCHORS adds lab flags, e.g.
# ANCHORS="--json" or ANCHORS="--faults sigstop --systems myriarch-lease".
ANCHORS_REPS ?= 3
ANCHORS ?=
.PHONY: proof-anchors
proof-anchors:
	$(GO) run ./cmd/myriarch-lab anchors --reps $(ANCHORS_REPS) $(ANCHORS)

# MQTT→MQTT in one run (needs mosquitto): direct, mosquitto's own bridge,
# myriarch-bridge on an ephemeral and on an exclusive session; prints the
# table of docs/bridge.md "Throughput" with the ratio against mosquitto's
# bridge, CPU per message and the load average; then the spool's rows
# (BenchmarkCompareSpool): the bridge without a spool, with one at fsync
# interval and at fsync always, against the same anchor, and the spool's own
# append+settle rate per fsync policy. BENCH=. runs every benchmark.
BENCH ?= Compare
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime 1x -timeout 20m ./internal/bridge/bench/

# Under CI=true the real OpAMP agent and helm are built before the unit tests
# (their tests fail without them); elsewhere the agent's test skips until
# `make otel-agent` has run once, and the chart tests build helm on first use.
# The checks and builds before the unit tests do not depend on each other
# and run in parallel (their output grouped per target); the first failure
# fails `make test` after the others finish, and the unit tests run only
# when all of them passed.
TEST_PREREQS = tidy vet staticcheck $(if $(filter true,$(CI)),otel-agent helm)
test:
	@$(MAKE) --no-print-directory -j $(words $(TEST_PREREQS)) -O $(TEST_PREREQS)
	@$(MAKE) --no-print-directory unit

# The real OpAMP agent for internal/fleet/otelagent's test: the
# OpenTelemetry OpAMP supervisor and a small collector, v0.149.0, cached in
# ~/.cache/myriarch/otel-v0.149.0 (OTEL_AGENT_DIR overrides); about 10
# minutes the first time, nothing once cached.
otel-agent:
	GO=$(GO) tools/otelagent/build.sh

# go.mod and go.sum must be what `go mod tidy` writes: direct requirements
# listed as such, nothing missing, nothing stale. Fix with `go mod tidy`.
tidy:
	$(GO) mod tidy -diff

# The real helm v3.22.0 for deploy's chart tests, built from tools/helm (its
# own module) into the cache the tests look in; nothing once it is there.
HELM_BIN ?= $${XDG_CACHE_HOME:-$$HOME/.cache}/myriarch-test/helm-v3.22.0
helm:
	@[ -x "$(HELM_BIN)" ] || $(GO) build -C tools/helm -o "$(HELM_BIN)" helm.sh/helm/v3/cmd/helm

# The lease clock and the bridge's socket I/O use raw system calls whose
# types differ on 32-bit targets (ARM gateways run bridges): vet them there.
vet:
	$(GO) vet ./...
	GOARCH=arm $(GO) vet ./lease/... ./internal/bridge/mqttconn/...

staticcheck:
	$(GO) tool staticcheck ./...

unit:
	$(GO) test -race -timeout 20m $(TESTFLAGS) ./...

build:
	$(GO) build ./...

# Regenerate the tables in docs/ from code (a test fails when they drift).
docs:
	$(GO) generate ./...

# Short fuzzing pass over the parsers; FUZZTIME=1m for longer.
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./internal/disclose -run '^$$' -fuzz FuzzBridgeBudgetFlags -fuzztime $(FUZZTIME)
	$(GO) test ./failover -run '^$$' -fuzz FuzzParseBrokerHealthStepDown -fuzztime $(FUZZTIME)
	$(GO) test ./internal/bridge/sender/amqp/routingkey -run '^$$' -fuzz FuzzTemplate -fuzztime $(FUZZTIME)
	$(GO) test ./internal/bridge/deadletter -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME)

# Container images of both daemons without a Docker daemon: static binaries
# on an empty base, non-root, OCI labels; docker-archive tarballs in dist/
# for `docker load -i` / `podman load -i`. The tag defaults to the charts'
# appVersion, so the charts' default image is what this builds.
VERSION ?= $(shell sed -n 's/^appVersion: *"\(.*\)"/\1/p' deploy/helm/myriarchd/Chart.yaml)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
image:
	$(GO) run ./internal/image/mkimage -version $(VERSION) -revision "$(REVISION)" -out dist
