# Sluice. `make run` starts the product, `make test` runs every test.
SHELL := /bin/bash
GO ?= go
# Every go command builds without the checkout's directory in its inputs,
# so a new clone (CI's, a helper's) reuses what the Go cache holds for the
# same sources instead of compiling the module again: go test ./... in a
# second new clone took 1 min 44 s with it, where make test's first run
# in a new clone took 3 min 29-47 s without.
export GOFLAGS ?= -trimpath
BUILD := build
WASM := $(BUILD)/plugin.wasm
# Fuzz budget per target, as a count of inputs: a duration (-fuzztime=3s)
# races Go 1.26's fuzz coordinator against its own deadline and fails with a
# bare "context deadline exceeded" on a loaded machine (go.dev/issue/75804,
# fixed in Go 1.27); a count has no deadline to race.
FUZZTIME ?= 2000x
# With that default a few dear targets run for fewer inputs (their counts
# in internal/tools/fuzzrun); a FUZZTIME given to make applies to all.
FUZZ_FLAGS := $(if $(filter file,$(origin FUZZTIME)),-quick)

.PHONY: all wasm oci bridge gateway demo-upstream test test-side test-fuzz test-long bench bench-bridge bench-bridge-rows run lint check deps clean

all: wasm bridge gateway demo-upstream

# The plugin: upstream Go, wasip1, c-shared (a reactor with _initialize),
# its data segments merged (internal/wasmbuild, as the tests build it).
wasm:
	@mkdir -p $(BUILD)
	$(GO) run ./internal/tools/buildwasm -o $(WASM) ./plugin
	@ls -l $(WASM) | awk '{print "plugin.wasm:", $$5, "bytes"}'

# OCI image layouts, ready for `crane push DIR REF` or `oras cp
# --from-oci-layout DIR:$(OCI_TAG) REF`, each digest printed to pin
# (docs/deploy.md): build/oci/plugin for Istio's WasmPlugin (oci://), and
# build/oci/redisbridge, the bridge linked statically on an empty base,
# for deploy/kubernetes, and build/oci/gateway, the gateway and the plugin
# likewise, for deploy/kubernetes/gateway.
OCI_TAG ?= latest
oci: wasm
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BUILD)/redisbridge-static ./cmd/redisbridge
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BUILD)/gateway-static ./cmd/gateway
	$(GO) run ./internal/ociimage/cmd/ociimage -wasm $(WASM) -bridge $(BUILD)/redisbridge-static \
	  -gateway $(BUILD)/gateway-static -out $(BUILD)/oci -tag $(OCI_TAG)

bridge:
	@mkdir -p $(BUILD)
	$(GO) build -trimpath -o $(BUILD)/redisbridge ./cmd/redisbridge

gateway:
	@mkdir -p $(BUILD)
	$(GO) build -trimpath -o $(BUILD)/gateway ./cmd/gateway

demo-upstream:
	@mkdir -p $(BUILD)
	$(GO) build -trimpath -o $(BUILD)/demo-upstream ./cmd/demo-upstream

# Debian packages the tests and `make run` need; installed when missing (we are root in CI).
# prometheus ships promtool, which checks deploy/prometheus/alerts.yaml; nodejs
# is V8, Envoy's default Wasm engine, which the plugin's tests also run it on;
# postgresql ships initdb and postgres (not on PATH) for the policy store's tests.
deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || missing="$$missing redis-tools"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	ls /usr/lib/postgresql/*/bin/initdb /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root, or: sudo apt-get install -y$$missing"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The rules package's tests also run compiled to WebAssembly on wazero, as
# the plugin runs its code (internal/tools/wasmexec); they and the fuzz
# targets (test-side) run beside the main suite at the lowest CPU priority:
# its tests leave about a third of the CPU idle, waiting on Redis, on
# failovers and on timeouts, and at nice 19 the side takes only that. On a
# 2-vCPU VM, warm, make test took 2 min 57 s to 3 min 08 s with the two one
# after the other, 2 min 20 s so; the suite's own times did not change.
# The side's output follows the suite's.
test: deps wasm
	@rm -f $(BUILD)/test-side.log
	@nice -n 19 $(MAKE) --no-print-directory test-side >$(BUILD)/test-side.log 2>&1 & side=$$!; \
	$(GO) test -count=1 ./...; st=$$?; \
	wait $$side; side_st=$$?; cat $(BUILD)/test-side.log; \
	if [ $$side_st != 0 ]; then echo "make test-side failed (its output above)"; fi; \
	[ $$st = 0 ] && [ $$side_st = 0 ]

test-side:
	$(GO) build -o $(BUILD)/wasmexec ./internal/tools/wasmexec
	GOOS=wasip1 GOARCH=wasm $(GO) test -count=1 -exec $(abspath $(BUILD))/wasmexec ./rules
	$(MAKE) --no-print-directory test-fuzz

# Long soaks: tests named TestLong_* in files built with the tag "long"
# (random differential runs at length, floods, failovers). CI runs them
# after the fast suite.
test-long: deps
	$(GO) test -count=1 -tags long -run '^TestLong_' -timeout 20m ./...

# Each fuzz target runs briefly from its seed corpus, two at a time, each
# package's instrumented test binary built once (internal/tools/fuzzrun:
# go test -fuzz takes one target at a time and links the binary again for
# each; that linking was most of this phase's CPU). An input that fails is
# written under testdata/fuzz and runs first on every later `go test`.
# Every run starts from the seeds alone, with its own empty cache of
# interesting inputs under $(FUZZ_CACHE) (fuzzrun's doc says why).
FUZZ_JOBS ?= 2
FUZZ_CACHE := $(abspath $(BUILD))/fuzzcache
test-fuzz:
	$(GO) run ./internal/tools/fuzzrun -go $(GO) -count $(FUZZTIME) $(FUZZ_FLAGS) -jobs $(FUZZ_JOBS) -cache $(FUZZ_CACHE)

# Timing targets live here, never in pass/fail tests. Fixed iteration
# counts where a benchmark sets up load (bridge processes, wasm hosts).
# -bench=HotKey in ./e2e/distributed sends one key through 2 gateway
# processes to 3 bridges, with and without leases (docs/bridge.md, Leases).
# -bench=Wasm in ./plugin prints the plugin's cost per request on V8
# (BenchmarkWasmV8, through Node) beside wazero's (BenchmarkWasm): same
# configuration, same requests, guest-ns/op measured the same way, and
# above-baseline-ns/op the median of rounds alternating each path with
# the disabled plugin.
# Benchmarks that measure paths against each other append rows to
# $(BENCH_TABLE) (internal/benchtable); the table is printed at the end.
BENCH_TABLE := $(BUILD)/bench-table.jsonl
BENCH_ROUNDS ?= 5
BENCH_ENV := SLUICE_BENCH_TABLE=$(abspath $(BENCH_TABLE))

bench: deps wasm
	@mkdir -p $(BUILD); rm -f $(BENCH_TABLE)
	$(BENCH_ENV) $(GO) test -run='^$$' -bench=. -benchmem ./rules ./plugin/filter ./wasmhost ./internal/envoycheck
	$(BENCH_ENV) $(GO) test -run='^$$' -bench=Wasm -benchmem -benchtime=50000x ./plugin
	$(BENCH_ENV) $(GO) test -run='^$$' -bench='Memory_Check|Server_Check|Server_ServeCheck|DecodeCheckRequest' -benchmem -benchtime=100000x ./redisbridge
	$(BENCH_ENV) $(GO) test -run='^$$' -bench=. -benchmem ./redisbridge/internal/h1fast ./redisbridge/internal/h2fast
	$(BENCH_ENV) $(GO) test -run='^$$' -bench=. -benchmem ./redisbridge/internal/store
	$(BENCH_ENV) $(GO) test -run='^$$' -bench=Policy_ReachesProxies -benchtime=20x ./e2e
	$(BENCH_ENV) $(GO) test -run='^$$' -bench=Gateway -benchtime=20000x ./cmd/gateway
	$(BENCH_ENV) $(GO) test -run='^$$' -bench=HotKey -benchtime=20000x ./e2e/distributed
	$(GO) test -run='^$$' -bench='BridgeProcess_HotKey' -benchtime=50000x ./redisbridge
	$(MAKE) bench-bridge-rows
	@$(GO) run ./internal/benchtable/cmd/benchtable $(BENCH_TABLE)

# The bridge as its own process against a local redis-server, next to
# redis-benchmark calling the check script directly and envoyproxy/
# ratelimit answering the same rate limit service calls (built from the Go
# module proxy), all in one run (docs/bridge.md, "Measuring"); prints its
# part of the table.
bench-bridge: deps
	@mkdir -p $(BUILD); rm -f $(BENCH_TABLE)
	$(MAKE) bench-bridge-rows
	@$(GO) run ./internal/benchtable/cmd/benchtable $(BENCH_TABLE)

bench-bridge-rows:
	$(BENCH_ENV) $(GO) test -run='^$$' -bench='BridgeTable' -benchtime=120000x -timeout 30m ./redisbridge -args -bench.rounds $(BENCH_ROUNDS)

# Starts the bridge (memory store, or Redis when REDIS_URL is set), a demo
# upstream and the gateway; Ctrl-C stops them all.
run: deps all
	./scripts/run.sh

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./rules ./plugin/...

check: lint
	GOOS=wasip1 GOARCH=wasm $(GO) build ./rules
	@cp go.mod $(BUILD)/go.mod.bak 2>/dev/null || { mkdir -p $(BUILD); cp go.mod $(BUILD)/go.mod.bak; }; cp go.sum $(BUILD)/go.sum.bak; \
	$(GO) mod tidy; \
	if ! cmp -s go.mod $(BUILD)/go.mod.bak || ! cmp -s go.sum $(BUILD)/go.sum.bak; then \
	  echo "go mod tidy would change go.mod/go.sum:"; diff -u $(BUILD)/go.mod.bak go.mod | head -40; \
	  cp $(BUILD)/go.mod.bak go.mod; cp $(BUILD)/go.sum.bak go.sum; exit 1; fi

clean:
	rm -rf $(BUILD)
