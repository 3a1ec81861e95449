# Myriarch. `make demo` runs the main job on embedded defaults; `make test` runs every check.
GO ?= go
TESTFLAGS ?=

.PHONY: demo test vet staticcheck unit docs fuzz build budgets bench failover-lab

# The main job: two bridge processes, an embedded broker and sink, a steady
# QoS 1 publisher; kill the owner, then cut the owner's broker path, and
# print budget against measured failure-to-full, losses and duplicates.
# LAB adds lab flags, e.g. LAB="--scenarios all --store etcd" for the owner
# scenarios (SIGSTOP, store partition, unreachable broker; ~2 minutes) or
# LAB="--broker mosquitto --broker-queue-limit 1000 --rate 250".
LAB ?=
demo:
	$(GO) run ./cmd/myriarch-bridge lab $(LAB)

# The failover arithmetic of both daemons at their defaults.
budgets:
	$(GO) run ./cmd/myriarch-bridge budget
	$(GO) run ./cmd/myriarch-bridge budget --deployment-mode clustered --broker-health-step-down 90s
	$(GO) run ./cmd/myriarchd budget

# Leader failover scenarios of myriarchd against a throwaway PostgreSQL
# (the network-namespace scenario needs root).
failover-lab:
	$(GO) run ./cmd/myriarchd failover-lab

# MQTT→MQTT throughput and latency through one bridge vs direct (needs mosquitto).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x ./internal/bridge/bench/

test: vet staticcheck unit

vet:
	$(GO) vet ./...

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
