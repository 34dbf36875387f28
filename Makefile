# vmtier — top-level targets. `make demo` and `make test` are the two set-up commands:
# both install what they need first (tools/install-deps, idempotent).

CARGO ?= cargo
TARGET := $(CURDIR)/target
BIN := $(TARGET)/release
GUEST := $(TARGET)/workload-guest/workload.elf

.PHONY: all deps build guest demo test test-contract test-unit test-guest test-testbed lint testbed clean bench bench-policies kmod bench-kmod bench-e2e fuzz fuzz-short fuzz-kmod soak

all: build

deps:
	tools/install-deps

build: deps
	$(CARGO) build --release --workspace --locked
	$(MAKE) -C tests/workload-guest O=$(TARGET)/workload-guest
	$(MAKE) kmod
	$(MAKE) agent

guest:
	$(MAKE) -C tests/workload-guest O=$(TARGET)/workload-guest

# The main job: the tiered host boots, the workload guest starts with its RAM on the CXL
# node, vmtierd manages it under a DRAM budget: the hot set moves into DRAM live, then the
# budget is cut at runtime; a summary table ends it.
demo: build
	tests/testbed/run -- $(BIN)/tbcheck daemon --elf $(GUEST) --demo

# Everything: unit tests, lints, a short fuzzing pass, the guest's own smoke test, install into a
# scratch root and the Debian package (tools/test-install), the testbed suite.
test: build
	$(MAKE) --no-print-directory test-unit lint fuzz-short test-guest test-install-checked test-testbed

test-unit:
	$(CARGO) test --workspace --locked

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# Coverage-guided fuzzing (libFuzzer) of the control-socket decoder, the config parser and the
# guest hint channel,
# from the committed corpus in fuzz/corpus (docs/fuzzing.md). fuzz-short is part of make test.
FUZZ_TARGETS := control config hints
FUZZ_SECONDS ?= 25
FUZZ_RUNS ?= 5000000

fuzz-short: deps
	@for t in $(FUZZ_TARGETS); do fuzz/run $$t -max_total_time=$(FUZZ_SECONDS) || exit 1; done

# The long run: FUZZ_RUNS executions of each target.
fuzz: deps
	@for t in $(FUZZ_TARGETS); do fuzz/run $$t -runs=$(FUZZ_RUNS) || exit 1; done

test-guest: guest
	tests/workload-guest/smoke.sh $(GUEST)

test-testbed:
	tests/testbed/suite

# The live API against docs/openapi.yaml with schemathesis (8-15 min under TCG): opt-in.
test-contract: build
	tests/testbed/suite api-contract

# Benchmarks print tables and write JSON under target/bench/; they assert nothing about speed.
bench: bench-policies bench-kmod bench-e2e

# Policies on the trace suite vs the oracle, plus the 1 TiB scale figures (docs/policies.md).
bench-policies: deps
	$(CARGO) run --release --locked -p vmtier-sim --bin vmtier-sim -- report

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
# row's residency checked: table + target/bench/kmod-CPU.json per testbed CPU model.
# One table per TCG CPU model: max (ERMS: the kernel's copy is rep movsb, byte by byte
# under TCG) and max,-erms,-fsrm (the unrolled copy loop); docs/kmod.md "Measured".
BENCH_KMOD_CPUS ?= max max,-erms,-fsrm
bench-kmod: build
	@rc=0; for cpu in $(BENCH_KMOD_CPUS); do \
	  out=$(TARGET)/bench/kmod-$$(echo $$cpu | tr ',' '_').json; \
	  tests/testbed/run --quiet --timeout 1800 --cpu $$cpu -- $(BIN)/tbcheck kmod-bench --ko-dir $(TARGET)/kmod --out $$out || rc=1; \
	  run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
	  echo "== cpu $$cpu ($$out)"; sed -n '/^kmod-bench: /,/^json /p' $$run/console.log; \
	done; exit $$rc

# The long ioctl fuzzer (the suite's kmod-fuzz case is a short run of it).
FUZZ_CALLS ?= 100000
fuzz-kmod: build
	tests/testbed/run --quiet --timeout 3600 -- $(BIN)/tbcheck kmod-fuzz --ko-dir $(TARGET)/kmod --calls $(FUZZ_CALLS) --secs 3000; \
	rc=$$?; run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
	grep -E '^(kmod-fuzz|ok|not ok|[0-9]+ passed)' $$run/console.log; exit $$rc

# vmtierd vs NUMA balancing (tiering mode) vs DAMOS migrate_hot/cold on the same guest under
# the same physical DRAM budget, in one testbed run: table + target/bench/e2e.json (docs/daemon.md).
bench-e2e: build
	tests/testbed/run --quiet --timeout 3000 -- $(BIN)/tbcheck bench-e2e --elf $(GUEST) --out $(TARGET)/bench/e2e.json $(E2E_ARGS); \
	rc=$$?; run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
	sed -n '/^bench-e2e:/,/ passed, [0-9]* failed$$/p' $$run/console.log | grep -v '^\[ *[0-9.]*\]'; exit $$rc

# Opt-in soak (not part of `make test`): vmtierd migrates >= 10^5 guest pages (move_pages and
# the module, THP and 4 KiB) under a budget changed every 2-3 ticks while the guest writes;
# zero corrupted words. Table + target/bench/soak.json (docs/testbed.md). SOAK_ARGS adds options;
# vmtierd's per-tick plans (engine debug log) land in the run directory's soak/*/vmtierd.log.
soak: build
	RUST_LOG=$${RUST_LOG:-info,vmtier_daemon::engine=debug} tests/testbed/run --quiet --timeout 1800 -- $(BIN)/tbcheck soak --elf $(GUEST) --ko-dir $(TARGET)/kmod --out $(TARGET)/bench/soak.json $(SOAK_ARGS); \
	rc=$$?; run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
	sed -n '/^soak: /,/ passed, [0-9]* failed$$/p' $$run/console.log | grep -v '^\[ *[0-9.]*\]' | grep -v '^  '; exit $$rc

# The guest agent (docs/guest-agent.md) as a static binary with no runtime dependencies:
# target/agent/vmtier-agent, plus its systemd unit, init script and example configuration
# in guest-agent/dist.
AGENT := $(TARGET)/agent/vmtier-agent
.PHONY: agent
agent:
	RUSTFLAGS='-C target-feature=+crt-static' $(CARGO) build --release --locked -p vmtier-agent --target x86_64-unknown-linux-gnu
	install -D -s -m 0755 $(TARGET)/x86_64-unknown-linux-gnu/release/vmtier-agent $(AGENT)

# Opt-in, not in `make test`: a nested Linux guest (6.12, busybox initramfs) runs the static
# agent inside the tiered host, under vmtierd with a [vm.hints] channel on its virtio-serial
# port; checks vmtierd's view in `vmtierctl status` (docs/guest-agent.md). Nested TCG is slow:
# about 15 min. AGENT_NESTED_SECS is the agent's run time in the guest (guest seconds).
AGENT_NESTED_SECS ?= 60
.PHONY: agent-nested
agent-nested: build
	tests/testbed/run --quiet --timeout 2400 -- $(CURDIR)/tests/testbed/agent-nested $(AGENT_NESTED_SECS); \
	rc=$$?; run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
	sed -n '/^after /p;/^--- /,/^agent-nested: /p' $$run/console.log | grep -v '^\[ *[0-9.]*\]'; exit $$rc
# Installs vmtierd, vmtierctl, the systemd unit, the example configuration, the docs and the
# module's DKMS source tree under $(DESTDIR) (docs/packaging.md). Run `make build` first.
DESTDIR ?=
PREFIX ?= /usr
.PHONY: install test-install test-install-checked
VMTIER_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
install:
	install -d -m 0755 $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(PREFIX)/bin $(DESTDIR)/lib/systemd/system \
		$(DESTDIR)$(PREFIX)/share/doc/vmtier $(DESTDIR)$(PREFIX)/src/vmtier-$(VMTIER_VERSION)
	install -d -m 0750 $(DESTDIR)/etc/vmtier
	install -m 0755 $(BIN)/vmtierd $(DESTDIR)$(PREFIX)/sbin/vmtierd
	install -m 0755 $(BIN)/vmtierctl $(DESTDIR)$(PREFIX)/bin/vmtierctl
	install -m 0644 packaging/vmtierd.service $(DESTDIR)/lib/systemd/system/vmtierd.service
	install -m 0640 vmm/daemon/vmtierd.example.toml $(DESTDIR)/etc/vmtier/vmtierd.toml.example
	install -m 0644 docs/*.md docs/openapi.yaml docs/grafana-dashboard.json $(DESTDIR)$(PREFIX)/share/doc/vmtier/
	cp -r host-kmod/. $(DESTDIR)$(PREFIX)/src/vmtier-$(VMTIER_VERSION)/

# make install into a scratch root, checked (tools/test-install).
test-install: build
	tools/test-install

# The same inside make test (which has built already).
test-install-checked:
	tools/test-install

# A Debian package built from the `make install` tree with dpkg-deb (target/vmtier_VERSION_amd64.deb).
.PHONY: deb
deb: build
	rm -rf $(TARGET)/deb-root
	$(MAKE) -s install DESTDIR=$(TARGET)/deb-root
	install -d -m 0755 $(TARGET)/deb-root/DEBIAN
	sed 's/@VERSION@/$(VMTIER_VERSION)/' packaging/debian/control.in >$(TARGET)/deb-root/DEBIAN/control
	dpkg-deb --root-owner-group --build $(TARGET)/deb-root $(TARGET)/vmtier_$(VMTIER_VERSION)_amd64.deb

# vmtierd's own CPU per tick (docs/policies.md, "vmtierd's CPU per tick"), a benchmark, not part
# of make test: per tracking mode (2M, hybrid, 4K), ticks in which nothing moved (steady tracking
# and planning, the placement refresh amortised) apart from moving (CPU per MiB moved), at two or
# more sizes, fitted as fixed + per GiB and extrapolated to 64 GiB: table + target/bench/cpu.json.
# Natively when vmtierd's engine can attach to a process here (a free DAMON kdamond slot or
# soft-dirty); otherwise in the tiered testbed (TCG), turned into a native estimate by emulation
# factors measured in the same invocation (the same microbenchmarks natively and in the testbed).
CPU_BENCH_SIZES ?= 1G,4G
CPU_BENCH_TESTBED_SIZES ?= 256M,768M
CPU_BENCH_TICKS ?= 30
.PHONY: bench-cpu
bench-cpu: deps
	$(CARGO) build --release --locked -p vmtier-testbed-tools
	@mkdir -p $(TARGET)/bench
	@if $(BIN)/tbcheck cpu-bench --probe >/dev/null 2>&1; then \
		echo "bench-cpu: natively (vmtierd's engine can attach to a process on this host)"; \
		$(BIN)/tbcheck cpu-bench --size $(CPU_BENCH_SIZES) --ticks $(CPU_BENCH_TICKS) --out $(TARGET)/bench/cpu.json; \
	else \
		echo "bench-cpu: no usable hotness source on this host (tbcheck cpu-bench --probe): measuring in the tiered testbed (TCG-emulated), converted to a native estimate with emulation factors measured now"; \
		echo "bench-cpu: load average before: $$(cut -d' ' -f1-3 /proc/loadavg)"; \
		$(BIN)/tbcheck cpu-bench --micro-only --out $(TARGET)/bench/cpu-native-micro.json | grep '^not ok' && exit 1; \
		for try in 1 2 3; do \
			tests/testbed/run --quiet --timeout 1800 --append numa_balancing=disable -- $(BIN)/tbcheck cpu-bench --size $(CPU_BENCH_TESTBED_SIZES) --ticks $(CPU_BENCH_TICKS) --native-micro $(TARGET)/bench/cpu-native-micro.json --out $(TARGET)/bench/cpu.json; \
			rc=$$?; run=$$(ls -td $(TARGET)/testbed/runs/*/ | head -n 1); \
			if [ $$rc = 125 ] && grep -q 'Oops: int3' $$run/console.log; then echo "bench-cpu: the tiered host died of a TCG int3 Oops (docs/testbed.md), run $$try of 3"; continue; fi; \
			break; \
		done; \
		sed -n '/^cpu-bench:/,/ passed, [0-9]* failed$$/p' $$run/console.log | grep -v '^\[ *[0-9.]*\]'; \
		echo "bench-cpu: load average after: $$(cut -d' ' -f1-3 /proc/loadavg)"; exit $$rc; \
	fi
