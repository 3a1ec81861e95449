# Myriarch. `make demo` runs the main job on embedded defaults; `make test` runs every check.
GO ?= go
TESTFLAGS ?=

.PHONY: demo test vet staticcheck unit docs fuzz build

demo:
	$(GO) run ./cmd/myriarch-bridge budget
	$(GO) run ./cmd/myriarch-bridge budget --deployment-mode clustered --broker-health-step-down 90s
	$(GO) run ./cmd/myriarchd budget

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
