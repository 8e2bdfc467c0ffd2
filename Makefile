# bootstrap: build, test, lint. `make test` is the test command CI runs.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BIN := bin/bootstrap
# Lab binaries (kube-apiserver, etcd, kwok, Flux controllers) built from pinned sources.
LAB_BIN ?= $(CURDIR)/.lab/bin
export BOOTSTRAP_LAB_BIN := $(LAB_BIN)

.PHONY: all build test test-unit lint lab-bins bench e2e demo clean

all: build

build:
	$(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/bootstrap

# Builds the lab binaries once for the pinned versions (no-op when present).
lab-bins:
	@if [ -x lab/tools/build.sh ]; then lab/tools/build.sh "$(LAB_BIN)"; else echo "no lab tools in this tree"; fi

# THE test command: everything, against the simulators and the real lab.
# BOOTSTRAP_REQUIRE_LAB=1 turns a missing lab component into a failure.
test: lab-bins
	BOOTSTRAP_REQUIRE_LAB=1 $(GO) test -count=1 -timeout 45m ./...

# End to end as a user runs it: the built binary against a lab (also part of
# `make test`). 100 kill points instead of 20: make e2e E2E_KILL_CASES=100
E2E_RUN ?= .
e2e: lab-bins
	BOOTSTRAP_REQUIRE_LAB=1 $(GO) test -count=1 -timeout 40m -v -run '$(E2E_RUN)' ./e2e/

# The benchmark table of README: wall time against the critical path of the
# n100 profile, re-run, postcheck, RSS and API calls for 1, 3+2 and 3+3 nodes.
BENCH_ARGS ?=
bench: build lab-bins
	$(GO) run ./e2e/cmd/bench -binary $(BIN) -readme README.md $(BENCH_ARGS)

# Quick unit tests without the lab requirement.
test-unit:
	$(GO) test -count=1 ./...

# The quick start: build, start a lab, run the whole pipeline against it,
# show the result, tear the lab down.
DEMO_DIR ?= lab
demo: build lab-bins
	@trap '$(BIN) lab down --dir $(DEMO_DIR)' EXIT; \
	$(BIN) lab up --detach --dir $(DEMO_DIR) --control-planes $${CONTROL_PLANES:-1} --workers $${WORKERS:-1} && \
	$(BIN) run --config $(DEMO_DIR)/bootstrap.yaml --stage all && \
	$(BIN) status --config $(DEMO_DIR)/bootstrap.yaml

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin
