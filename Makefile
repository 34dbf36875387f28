# vmtier — top-level targets. `make demo` and `make test` are the two set-up commands:
# both install what they need first (tools/install-deps, idempotent).

CARGO ?= cargo
TARGET := $(CURDIR)/target
BIN := $(TARGET)/release
GUEST := $(TARGET)/workload-guest/workload.elf

.PHONY: all deps build guest demo test test-unit test-guest test-testbed lint testbed clean bench bench-policies kmod bench-kmod bench-e2e fuzz-kmod

all: build

deps:
	tools/install-deps

build: deps
	$(CARGO) build --release --workspace --locked
	$(MAKE) -C tests/workload-guest O=$(TARGET)/workload-guest
	$(MAKE) kmod

guest:
	$(MAKE) -C tests/workload-guest O=$(TARGET)/workload-guest

# The main job: the tiered host boots, the workload guest starts with its RAM on the CXL
# node, vmtierd manages it under a DRAM budget: the hot set moves into DRAM live, then the
# budget is cut at runtime; a summary table ends it.
demo: build
	tests/testbed/run -- $(BIN)/tbcheck daemon --elf $(GUEST) --demo

# Everything: unit tests, lints, the guest's own smoke test, the testbed suite.
test: build
	$(MAKE) --no-print-directory test-unit lint test-guest test-testbed

test-unit:
	$(CARGO) test --workspace --locked

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

test-guest: guest
	tests/workload-guest/smoke.sh $(GUEST)

test-testbed:
	tests/testbed/suite

# Benchmarks print tables and write JSON under target/bench/; they assert nothing about speed.
bench: bench-policies bench-kmod bench-e2e

# Policies on the trace suite vs the oracle, plus the 1 TiB scale figures (docs/policies.md).
bench-policies: deps
	$(CARGO) run --release --locked -p vmtier-policies --bin vmtier-sim -- report

# Run any command inside the tiered host: make testbed CMD='numactl -H'
testbed: build
	tests/testbed/run -- $(CMD)

clean:
	$(CARGO) clean
	$(MAKE) -C tests/workload-guest O=$(TARGET)/workload-guest clean

# The host kernel module (and its test-only DMA provider) for the testbed's kernel, built
# out of tree in target/kmod. KVER=<release> builds for another installed kernel.
KMOD_KVER ?= $(shell ls /boot/vmlinuz-6.12.*+deb12-amd64 2>/dev/null | sed 's|.*/vmlinuz-||' | sort -V | tail -n 1)
kmod:
	$(MAKE) -C host-kmod KVER=$(KMOD_KVER) O=$(TARGET)/kmod TESTS=y

# Module copy engines vs move_pages(2) inside the testbed, median of 5 runs per row, every
# row's residency checked: table + target/bench/kmod.json.
bench-kmod: build
	tests/testbed/run --quiet --timeout 1800 -- $(BIN)/tbcheck kmod-bench --ko-dir $(TARGET)/kmod --out $(TARGET)/bench/kmod.json; \
	rc=$$?; run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
	sed -n '/^kmod-bench: /,/^json /p' $$run/console.log; exit $$rc

# The long ioctl fuzzer (the suite's kmod-fuzz case is a short run of it).
FUZZ_CALLS ?= 100000
fuzz-kmod: build
	tests/testbed/run --quiet --timeout 3600 -- $(BIN)/tbcheck kmod-fuzz --ko-dir $(TARGET)/kmod --calls $(FUZZ_CALLS) --secs 3000; \
	rc=$$?; run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
	grep -E '^(kmod-fuzz|ok|not ok|[0-9]+ passed)' $$run/console.log; exit $$rc

# vmtierd vs NUMA balancing (tiering mode) vs DAMOS migrate_hot/cold on the same guest under
# the same physical DRAM budget, in one testbed run: table + target/bench/e2e.json (docs/daemon.md).
bench-e2e: build
	tests/testbed/run --quiet --timeout 600 -- $(BIN)/tbcheck bench-e2e --elf $(GUEST) --out $(TARGET)/bench/e2e.json; \
	rc=$$?; run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
	sed -n '/^bench-e2e:/,/ passed, [0-9]* failed$$/p' $$run/console.log | grep -v '^\[ *[0-9.]*\]'; exit $$rc
