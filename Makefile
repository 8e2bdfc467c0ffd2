# bootstrap: build, test, lint. `make test` is the test command CI runs.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BIN := bin/bootstrap
LAB := bin/bootstrap-lab
# Build tags of every build and test. kustomize (linked through Helm's
# resource builder and Flux's manifest generator) imports Go's plugin
# package unless told not to, and a binary importing plugin exports every
# symbol dynamically: +36 MiB on disk and +39 MiB resident at start (see
# `make binsize`). bootstrap loads no kustomize plugins.
TAGS := kustomize_disable_go_plugin_support
# The release binary: no file system paths, no symbol or DWARF tables.
GOBUILD := $(GO) build -tags $(TAGS) -trimpath -ldflags "-s -w -X main.version=$(VERSION)"
# Lab binaries (kube-apiserver, etcd, kwok, Flux controllers) built from pinned sources.
LAB_BIN ?= $(CURDIR)/.lab/bin
export BOOTSTRAP_LAB_BIN := $(LAB_BIN)

.PHONY: all build build-lab deps deps-then-lint test test-quick test-quick-short test-quick-pipeline test-times test-bins lint lint-files lint-units lab-bins lab-bins-demo demo-bins bench binsize e2e fuzz demo clean

all: build

# The product: the only binary users install.
build:
	$(GOBUILD) -o $(BIN) ./cmd/bootstrap

# The lab's own command (bootstrap-lab up|down|status): simulators and local services.
build-lab:
	$(GOBUILD) -o $(LAB) ./cmd/bootstrap-lab

# System packages the tests and the demo need (git, openssh-client, nfs-ganesha, rpcbind):
# installed with apt when running as root on Debian/Ubuntu, otherwise the
# exact command to run is printed and make stops.
deps:
	@scripts/deps.sh

# Builds the lab binaries once for the pinned versions (no-op when present).
# lab-bins-demo leaves out what only tests use (the previous Kubernetes minor).
lab-bins:
	@lab/tools/build.sh "$(LAB_BIN)"
lab-bins-demo:
	@lab/tools/build.sh --demo "$(LAB_BIN)"

# The commands tests run as processes (e2e, the detached lab, the postcheck
# lab test), built once for every test package instead of once by each.
TEST_BIN := $(CURDIR)/bin/test
test-bins:
	$(GO) build -tags $(TAGS) -o $(TEST_BIN)/ ./cmd/bootstrap ./cmd/bootstrap-lab
	$(GO) build -o bin/testtimes ./internal/testtimes

# How much runs side by side: test packages (compiling and linking too), the
# tests inside one package, and, across all of them, tests holding a lab (a
# real control plane; kubetest.Slot). Most of a lab test is waiting on
# simulated hardware, so more labs than CPUs fit; the bounded waits inside
# them do not depend on it (see docs/lab.md "Running the suite").
TEST_P ?= 3
TEST_PARALLEL ?= 3
TEST_LABS ?= 3
TEST_ENV := BOOTSTRAP_REQUIRE_LAB=1 BOOTSTRAP_TEST_BIN=$(TEST_BIN) BOOTSTRAP_TEST_LABS=$(TEST_LABS)

# The test phase's budget: `make test` fails when its tests (after lint and
# the lab binaries) take longer on 2 cores, so a change that slows the
# suite is seen in that change. The goal is 8m warm (docs/lab.md "Running
# the suite"); the budget stands at the ceiling of today's runs, cold ones
# included (they compile every test binary in this phase too), and comes
# down as the suite does. make test TEST_BUDGET=0 runs without it.
TEST_BUDGET ?= 24m
# The last run's `go test -json`, which `make test-times` reads.
TEST_TIMES := bin/test-times.json

# THE test command: lint, then everything, against the simulators and the
# real lab. BOOTSTRAP_REQUIRE_LAB=1 turns a missing lab component into a failure.
# The system packages (apt, mostly network) and then lint run beside
# lab-bins, which needs neither: on a fresh machine the downloads overlap
# the compiles, and vet's compiles fill what the lab's two build chains
# leave idle (a no-op beside them when warm). The tests' output is what
# plain go test prints, then the time of each package and the wall time.
test:
	@$(MAKE) --no-print-directory -j2 deps-then-lint lab-bins
	@$(MAKE) --no-print-directory test-bins
	set -o pipefail; $(TEST_ENV) $(GO) test -json -tags $(TAGS) -p $(TEST_P) -parallel $(TEST_PARALLEL) -count=1 -timeout 30m ./... \
		| bin/testtimes -save $(TEST_TIMES) -budget $(TEST_BUDGET)

# The slowest tests and packages of the last `make test`, with each test's
# wait for a lab slot and its control planes' start (TEST_TIMES_N of each).
TEST_TIMES_N ?= 30
test-times:
	@$(GO) run ./internal/testtimes -report $(TEST_TIMES) -n $(TEST_TIMES_N)

# Everyday work: every unit test (-short skips whatever needs the lab) and
# one pipeline end to end against the real lab, side by side. Most -short
# packages wait more than they compute (a simulated node, a bounded retry),
# so more of them run at once than there are CPUs (TEST_QUICK_P; 2 cores,
# warm: 182 s at go's default of 2, 143 s at 4, 141 s at 6).
TEST_QUICK_P ?= 4
test-quick: deps lab-bins test-bins
	@$(MAKE) --no-print-directory -j2 test-quick-short test-quick-pipeline
test-quick-short:
	$(GO) test -tags $(TAGS) -short -count=1 -p $(TEST_QUICK_P) ./...
test-quick-pipeline:
	$(TEST_ENV) $(GO) test -tags $(TAGS) -count=1 -run '^TestPipeline$$/^1cp$$' ./e2e/

# End to end as a user runs it: the built binary against a lab (also part of
# `make test`). 100 kill points instead of 20: make e2e E2E_KILL_CASES=100
E2E_RUN ?= .
e2e: deps lab-bins test-bins
	$(TEST_ENV) $(GO) test -tags $(TAGS) -count=1 -parallel $(TEST_PARALLEL) -timeout 30m -v -run '$(E2E_RUN)' ./e2e/

# The benchmark table of README: wall time against the critical path of the
# n100 profile, re-run, postcheck, RSS and API calls for 1, 3+2, 3+3 and 3+12
# nodes (3+12 on three Proxmox hosts); 3+3 and 3+12 also booted from the
# factory's disk image, beside the ISO.
BENCH_ARGS ?=
bench: deps build lab-bins
	$(GO) run ./e2e/cmd/bench -binary $(BIN) -readme README.md $(BENCH_ARGS)

# What each Go module costs in the release binary (scripts/binsize.sh):
# the stripped size, then the largest modules by symbol bytes.
binsize: deps
	./scripts/binsize.sh

# Fuzzing (not part of `make test`): each target runs for FUZZTIME. What it
# finds lands in the package's testdata/fuzz/<target>/ and then runs in
# every `go test` as a regression case; keep those files.
FUZZTIME ?= 5m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzUploadPackRequest$$' -fuzztime $(FUZZTIME) ./gitsnap/

# The quick start: build, start a lab, run the whole pipeline against it,
# show the result, tear the lab down. The lab's working files (config, token,
# demo git tree, NFS export, state) stay in the git-ignored $(DEMO_DIR).
DEMO_DIR ?= .lab/demo
# The newest Talos bootstrap supports (the config's default stays on the
# previous minor until the lab runs that minor's newest Kubernetes).
DEMO_TALOS_VERSION ?= v1.14.1
demo: deps
	@$(MAKE) --no-print-directory -j2 demo-bins lab-bins-demo
	@trap '$(LAB) down --dir $(DEMO_DIR)' EXIT; \
	$(LAB) up --detach --dir $(DEMO_DIR) --talos-version $(DEMO_TALOS_VERSION) --control-planes $${CONTROL_PLANES:-1} --workers $${WORKERS:-1} && \
	$(BIN) run --config $(DEMO_DIR)/bootstrap.yaml --stage all && \
	$(BIN) status --config $(DEMO_DIR)/bootstrap.yaml

# The demo's two commands, built one after the other (the second reuses the
# first's compiled packages) while the lab binaries build beside them.
demo-bins:
	$(GOBUILD) -o $(BIN) ./cmd/bootstrap
	$(GOBUILD) -o $(LAB) ./cmd/bootstrap-lab

# lint needs git (deps installs it on a fresh machine).
deps-then-lint: deps
	@$(MAKE) --no-print-directory lint

# vet takes the build's tags: its compiled packages then serve the tests
# (without them kustomize's plugin loader and every package above it would
# compile twice on a cold cache), and it checks the code that ships.
lint: lint-files lint-units
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags $(TAGS) ./...

# Nothing built in git: no executable binaries, nothing over 1 MB.
lint-files:
	@scripts/lint-files.sh

# The shipped systemd units, checked by systemd itself where it is installed.
# verify needs ExecStart= to exist, so it checks copies that run /bin/true;
# any complaint (unknown key, bad value) fails.
lint-units:
	@if command -v systemd-analyze >/dev/null; then \
		d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
		for f in deploy/systemd/*.service deploy/systemd/*.timer; do sed 's#/usr/local/bin/bootstrap#/bin/true#' "$$f" > "$$d/$${f##*/}"; done; \
		out=$$(cd "$$d" && systemd-analyze verify ./*.service ./*.timer 2>&1); rc=$$?; \
		if [ $$rc -ne 0 ] || [ -n "$$out" ]; then echo "systemd-analyze verify deploy/systemd:"; echo "$$out"; exit 1; fi; \
	else echo "lint-units: systemd-analyze not installed; skipped"; fi

clean:
	rm -rf bin
