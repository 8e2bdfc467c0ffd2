# bootstrap: build, test, lint. `make test` is the test command CI runs.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BIN := bin/bootstrap
LAB := bin/bootstrap-lab
# The release binary: no file system paths, no symbol or DWARF tables.
GOBUILD := $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)"
# Lab binaries (kube-apiserver, etcd, kwok, Flux controllers) built from pinned sources.
LAB_BIN ?= $(CURDIR)/.lab/bin
export BOOTSTRAP_LAB_BIN := $(LAB_BIN)

.PHONY: all build build-lab deps test test-unit lint lint-files lint-units lab-bins bench e2e fuzz demo clean

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
lab-bins:
	@lab/tools/build.sh "$(LAB_BIN)"

# THE test command: lint, then everything, against the simulators and the
# real lab. BOOTSTRAP_REQUIRE_LAB=1 turns a missing lab component into a failure.
# One test package at a time (-p 1): several packages start whole labs
# (real control planes, rpcbind, ganesha) and on a 2-core machine running
# them side by side starves their bounded waits.
test: deps lint lab-bins
	BOOTSTRAP_REQUIRE_LAB=1 $(GO) test -p 1 -count=1 -timeout 45m ./...

# End to end as a user runs it: the built binary against a lab (also part of
# `make test`). 100 kill points instead of 20: make e2e E2E_KILL_CASES=100
E2E_RUN ?= .
e2e: deps lab-bins
	BOOTSTRAP_REQUIRE_LAB=1 $(GO) test -count=1 -timeout 40m -v -run '$(E2E_RUN)' ./e2e/

# The benchmark table of README: wall time against the critical path of the
# n100 profile, re-run, postcheck, RSS and API calls for 1, 3+2 and 3+3 nodes.
BENCH_ARGS ?=
bench: deps build lab-bins
	$(GO) run ./e2e/cmd/bench -binary $(BIN) -readme README.md $(BENCH_ARGS)

# Fuzzing (not part of `make test`): each target runs for FUZZTIME. What it
# finds lands in the package's testdata/fuzz/<target>/ and then runs in
# every `go test` as a regression case; keep those files.
FUZZTIME ?= 5m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzUploadPackRequest$$' -fuzztime $(FUZZTIME) ./gitsnap/

# Quick unit tests without the lab requirement.
test-unit:
	$(GO) test -count=1 ./...

# The quick start: build, start a lab, run the whole pipeline against it,
# show the result, tear the lab down. The lab's working files (config, token,
# demo git tree, NFS export, state) stay in the git-ignored $(DEMO_DIR).
DEMO_DIR ?= .lab/demo
demo: deps build build-lab lab-bins
	@trap '$(LAB) down --dir $(DEMO_DIR)' EXIT; \
	$(LAB) up --detach --dir $(DEMO_DIR) --control-planes $${CONTROL_PLANES:-1} --workers $${WORKERS:-1} && \
	$(BIN) run --config $(DEMO_DIR)/bootstrap.yaml --stage all && \
	$(BIN) status --config $(DEMO_DIR)/bootstrap.yaml

lint: lint-files lint-units
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

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
