# capsan — build everything into build/, usable from the checkout.
#   make            build libcapsan.so, the capsan CLI, the Python package
#   make demo       install what is missing, build, run a buggy example under capsan
#   make test       install what is missing, build, run the whole test suite
#   make bench      overhead benchmarks (ratios against a plain run)
#   make bench-quick  only their instruction counts (callgrind), a few minutes
#   make bench-floor  the same for a runtime whose events end as they start
#   make bench-plugin  pytest --capsan against plain pytest and capsan run (CPU time)
#   make fuzz FUZZ_SECONDS=N   fuzz `capsan report` (libFuzzer, ASan+UBSan)
#   make asan       the runtime under ASan over the DLPack and NumPy scenarios
#   make stress     tests/test_stress.py 20 times in a row, large (STRESS_RUNS=, STRESS_SCALE=)
#   make stress-ft  the free-threaded stress, 60 s, 20 times in a row beside a CPU hog (FT_RUNS=, FT_SECONDS=)
#   make install PREFIX=/usr/local
#   make test-install  pip install . into a fresh venv of each CPython 3.10-3.13, and make install
#   make wheel      a manylinux wheel that needs only glibc: build/wheel/capsan-*.whl
#   make test-wheel  that wheel installed and run where Debian's libdw, libelf, libunwind, liblzma are hidden

PREFIX   ?= /usr/local
PYTHON   ?= /usr/bin/python3
CC       ?= cc
B        := build
PYINC    := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
NPINC    := $(shell $(PYTHON) -c 'import numpy; print(numpy.get_include())' 2>/dev/null)
WARN     := -Wall -Wextra -Werror
# the one version: the Python package's (`capsan --version`, the dist-info)
VERSION  := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' pyhook/capsan/__init__.py)
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -D_GNU_SOURCE $(WARN) -fno-omit-frame-pointer
# model/: the finding model both link (trace format, lifecycle, kinds and
# words, options, rendering as text and JSON, suppressions, leak groups);
# preload/ is the in-process runtime, reports/ the offline tool
MODEL_SRC := $(wildcard model/*.c)
# the runtime: PIC, hidden by default (only capsan_* is exported), no libpython
# link and no Python headers: one build serves every CPython (pyversions.inc)
# -flto: a hook, its emit, the thread's table and the stack capture live in
# four files; inlined across them an event costs less (W1 -500 and W2 -280
# instructions an iteration by callgrind). One partition: the asm stubs
# (capsule_dtor.c, xapi.c) define local labels the C code refers to.
# preload/: start.c and the public capsan.h at the top, then a folder per
# service (core, stacks, ending) and per seam (dlpack, exchange, numpy,
# arrow); their headers are included by name, from any folder
RT_DIRS  := preload $(patsubst %/,%,$(sort $(dir $(wildcard preload/*/*.c preload/*/*.h))))
RT_INC   := $(addprefix -I,$(RT_DIRS))
# CS_OWNHEAP: capsan's own memory from its own heap, not the program's malloc
# (model/alloc.h); the ASan build below leaves it out (ASan must see those
# blocks), the UBSan build keeps it
RT_CFLAGS := $(CFLAGS) -fPIC -fvisibility=hidden $(RT_INC) -Imodel -flto -DCS_OWNHEAP $(RT_DEFS)
# -flto-partition is gcc's (clang's -flto links one module anyway)
RT_LTO_LINK := $(if $(shell $(CC) --version 2>/dev/null | grep -i clang),,-flto-partition=one)
RT_SRC   := $(wildcard preload/*.c preload/*/*.c) $(MODEL_SRC)
RT_OBJ   := $(patsubst %.c,$(B)/obj/rt/%.o,$(RT_SRC))
# the report tool
CLI_SRC  := $(wildcard reports/*.c)
CLI_OBJ  := $(patsubst %.c,$(B)/obj/cli/%.o,$(CLI_SRC) $(MODEL_SRC))
CLI_LIBS := -ldw -lelf -lm
FIX_SRC  := $(wildcard tests/fixtures/*.c)
# fixtures are built per interpreter: build/tests for $(PYTHON), and
# build/tests/cpXYZ for each current-stack venv (make fixtures-current)
FIXOUT   ?= $(B)/tests
FIX_SO   := $(patsubst tests/fixtures/%.c,$(FIXOUT)/%.so,$(FIX_SRC))
UNIT_SRC := $(wildcard tests/unit/*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(B)/tests/unit/%,$(UNIT_SRC))
PY_SRC   := $(wildcard pyhook/capsan/*.py)
PY_OUT   := $(patsubst pyhook/capsan/%,$(B)/python/capsan/%,$(PY_SRC))

.PHONY: all deps demo test test-c test-py bench install clean check-numpy venvs fixtures-current fixture-sos
.PHONY: test-install realworld-venvs test-realworld arrow-venvs adbc-venvs check-upstream test-repeat
all: $(B)/lib/libcapsan.so $(B)/bin/capsan python

$(B)/obj/rt/%.o: %.c $(wildcard preload/*.h preload/*/*.h preload/*/*.inc model/*.h model/*.inc)
	@mkdir -p $(dir $@)
	$(CC) $(RT_CFLAGS) -c $< -o $@

$(B)/lib/libcapsan.so: $(RT_OBJ) preload/exports.map
	@mkdir -p $(dir $@)
	$(CC) $(RT_CFLAGS) $(RT_LTO_LINK) -shared -o $@ $(RT_OBJ) -Wl,--version-script=preload/exports.map \
	  -Wl,-z,now -Wl,-z,relro -Wl,--no-undefined -ldl -lpthread

$(B)/obj/cli/%.o: %.c $(wildcard model/*.h model/*.inc reports/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DCAPSAN_VERSION='"$(VERSION)"' -Imodel -Ireports -c $< -o $@

$(B)/bin/capsan: $(CLI_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(CLI_OBJ) $(CLI_LIBS)

# the package, and the dist-info that lets pytest autoload its plugin
# (`pytest --capsan` with build/python on sys.path; make install puts both in a site dir)
PY_DIST  := $(B)/python/capsan-$(VERSION).dist-info
python: $(PY_OUT) $(PY_DIST)/METADATA $(PY_DIST)/entry_points.txt
$(B)/python/capsan/%: pyhook/capsan/%
	@mkdir -p $(dir $@)
	cp $< $@
$(PY_DIST)/METADATA: Makefile
	@mkdir -p $(dir $@)
	printf 'Metadata-Version: 2.1\nName: capsan\nVersion: $(VERSION)\nSummary: sanitizer for DLPack capsules and NumPy data memory\n' > $@
$(PY_DIST)/entry_points.txt: Makefile
	@mkdir -p $(dir $@)
	printf '[pytest11]\ncapsan = capsan.pytest_plugin\n' > $@

# buggy and clean fixture extensions used by the tests
$(FIXOUT)/arrowsink.so: tests/fixtures/arrowfx.c
$(FIXOUT)/%.so: tests/fixtures/%.c $(wildcard tests/fixtures/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -I$(PYINC) -I$(NPINC) -Ipreload \
	  -DNPY_TARGET_VERSION=NPY_1_22_API_VERSION -o $@ $<

# a shared-libpython interpreter: Debian's /usr/bin/python3 links libpython statically
$(B)/tests/pyshared: tests/pyshared.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(PYINC) -o $@ $< -lpython3.11

MODEL_OBJ := $(patsubst %.c,$(B)/obj/cli/%.o,$(MODEL_SRC))
$(B)/tests/unit/%: tests/unit/%.c tests/unit/check.h preload/core/names.h preload/core/probe.c preload/core/probe.h $(MODEL_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ipreload/core -Imodel -o $@ $< preload/core/probe.c $(MODEL_OBJ)

fixtures: $(FIX_SO) $(B)/tests/pyshared $(UNIT_BIN)
fixture-sos: $(FIX_SO)

# The current stack: a venv per CPython 3.10-3.13 (numpy 2; torch 2.13 and
# JAX on 3.11), built once from the package registry and cached outside the
# checkout (.ci/venvs); build/venvs.txt lists "TAG PYTHON" for the tests.
venvs:
	@mkdir -p $(B)
	@bash .ci/venvs > $(B)/venvs.txt.new && mv $(B)/venvs.txt.new $(B)/venvs.txt
# Released libraries with bugs that shipped (.ci/realworld): build/realworld.txt
# lists "NAME PYTHON" for tests/test_realworld.py; make test runs it too
realworld-venvs:
	@mkdir -p $(B)
	@bash .ci/realworld > $(B)/realworld.txt.new && mv $(B)/realworld.txt.new $(B)/realworld.txt
test-realworld: all fixtures fixtures-current realworld-venvs
	@cd tests && $(PYTHON) -m pytest -q -p no:cacheprovider test_realworld.py $(PYTEST_ARGS)

# The Arrow PyCapsule stack (.ci/arrowvenvs: pyarrow, polars, duckdb,
# nanoarrow, arro3-core, pandas, pinned) for CPython 3.11 and 3.13:
# build/arrowvenvs.txt lists "TAG PYTHON" for tests/test_arrow_peers.py
arrow-venvs:
	@mkdir -p $(B)
	@bash .ci/arrowvenvs > $(B)/arrowvenvs.txt.new && mv $(B)/arrowvenvs.txt.new $(B)/arrowvenvs.txt

# ADBC's driver manager and SQLite driver beside the Arrow venvs' pins
# (.ci/adbcvenvs, its own cache): build/adbcvenvs.txt for
# tests/test_arrow_byaddr.py
adbc-venvs:
	@mkdir -p $(B)
	@bash .ci/adbcvenvs > $(B)/adbcvenvs.txt.new && mv $(B)/adbcvenvs.txt.new $(B)/adbcvenvs.txt

# The newest CPythons (.ci/newest): 3.14 and 3.15 from Debian unstable in
# a chroot of their own (capsan built there into build/sid), and a
# free-threaded 3.13t built from source; build/newest.txt lists "TAG ROOT
# PYTHON BUILD" for tests/test_newest.py. Built once and cached outside the
# checkout (about 10 minutes on a fresh machine)
.PHONY: newest test-newest
newest: all
	@mkdir -p $(B)
	@bash .ci/newest > $(B)/newest.txt.new && mv $(B)/newest.txt.new $(B)/newest.txt
test-newest: all fixtures newest
	@cd tests && $(PYTHON) -m pytest -q -p no:cacheprovider test_newest.py test_pyversions.py $(PYTEST_ARGS)

fixtures-current: venvs
	@while read -r tag py; do \
	  $(MAKE) --no-print-directory fixture-sos PYTHON=$$py FIXOUT=$(B)/tests/$$tag || exit 1; \
	done < $(B)/venvs.txt

deps:
	@bash .ci/deps

demo: deps
	@$(MAKE) --no-print-directory all fixtures
	@bash examples/demo.sh

test: deps
	@$(MAKE) --no-print-directory all fixtures fixtures-current realworld-venvs arrow-venvs adbc-venvs newest sanitizers fuzz-build wheel
	@$(MAKE) --no-print-directory test-c
	@$(MAKE) --no-print-directory test-san fuzz-regress
	@$(MAKE) --no-print-directory test-py

test-c: $(UNIT_BIN)
	@for t in $(UNIT_BIN); do $$t || exit 1; done

test-py:
	@cd tests && $(PYTHON) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# numpy's own test_mem_policy.py and test_dlpack.py under capsan (numpy 1.24
# and the cp311 venv's numpy 2), including the slow test_new_policy (the
# whole numpy core suite through a NEP 49 handler, > 5 min) that `make test`
# leaves out
check-numpy: all fixtures fixtures-current
	@cd tests && CAPSAN_CHECK_NUMPY=1 $(PYTHON) -m pytest -q -p no:cacheprovider test_numpy_suites.py $(PYTEST_ARGS)

# upstream DLPack and Arrow suites under capsan, at the installed releases:
# torch's test_dlpack.py, JAX's interoperability tests, tvm-ffi's DLPack tests
# (cp311 venv), pyarrow's test_dlpack.py (a private pinned venv), numpy's
# (test_numpy_suites.py, as in make test, and test_numeric.py), and the
# Arrow peers' (pyarrow, pandas, nanoarrow, arro3-core, duckdb, polars; the
# Arrow cp311 venv; docs/findings.md lists their true findings); the upstream
# files are obtained into ~/.cache/capsan/upstream (tests/upstream_sources.py)
check-upstream: all fixtures fixtures-current arrow-venvs
	@cd tests && CAPSAN_CHECK_UPSTREAM=1 $(PYTHON) -m pytest -q -p no:cacheprovider test_upstream_suites.py test_numpy_suites.py $(PYTEST_ARGS)

# the same verdict every run: each finding and clean scenario of
# tests/test_repeat.py N times (default 20) with a CPU hog on every core
# beside it; any difference between runs fails. make test runs its short
# form (3 runs of the cases marked SHORT)
N ?= 20
test-repeat: all fixtures fixtures-current
	@cd tests && CAPSAN_REPEAT=$(N) $(PYTHON) -m pytest -q -p no:cacheprovider test_repeat.py $(PYTEST_ARGS)

# `pip install .` into a fresh venv of every CPython 3.10-3.13 that .ci/venvs
# finds (make test does cp311 only), and make install
test-install: all venvs
	@cd tests && CAPSAN_INSTALL_PYTHONS=all $(PYTHON) -m pytest -q -p no:cacheprovider test_install.py $(PYTEST_ARGS)

# a manylinux_2_28 wheel (.ci/wheel): the tool linked with libdw, libelf and
# their compression libraries, libunwind (liblzma linked in) in
# lib/capsan.libs/, all compiled by zig cc for glibc 2.28 (.ci/wheel_deps),
# checked by auditwheel; build tools pinned in ~/.cache/capsan/wheel-tools-HASH
.PHONY: wheel test-wheel
wheel:
	@bash .ci/wheel

# tests/test_wheel.py alone (make test runs it too)
test-wheel: wheel venvs
	@cd tests && $(PYTHON) -m pytest -q -p no:cacheprovider test_wheel.py $(PYTEST_ARGS)

FLOOR_LIB := $(B)/floor/lib/libcapsan.so
.PHONY: floor-lib
floor-lib:
	@$(MAKE) --no-print-directory B=$(B)/floor RT_DEFS=-DCS_BENCH_FLOOR $(FLOOR_LIB)

bench: all fixtures venvs arrow-venvs newest floor-lib
	@BENCH_FLOOR_LIB=$(abspath $(FLOOR_LIB)) $(PYTHON) bench/run.py
	@$(PYTHON) bench/plugin_cost.py --real

# instructions per loop iteration under callgrind only (bench/icount.py):
# W1, W1d, W2, W2b, W5, W3 (and W4 with the Arrow venv) plain, under the
# floor's runtime (below), under capsan and under memray, without the
# 0-iteration runs and memray's other cases
.PHONY: bench-quick
bench-quick: all venvs floor-lib
	@BENCH_FLOOR_LIB=$(abspath $(FLOOR_LIB)) BENCH_ONLY=icount BENCH_CG_QUICK=1 $(PYTHON) bench/run.py

# pytest --capsan against a plain pytest run and `capsan run -- pytest` on
# numpy's test_numeric.py, torch's test_dlpack.py and arro3's tests
# (bench/plugin_cost.py: CPU time, best of 3; a suite that cannot be had is
# skipped with a message)
.PHONY: bench-plugin
bench-plugin: all venvs arrow-venvs
	@$(PYTHON) bench/plugin_cost.py

# The floor under any event path: the runtime built with events that end
# as they start (cs_emit returns: no thread, stack, table or trace), so
# only the hooks, the trampolines and the per-call checks and copies run.
# A lower bound: with no table a deleter trampoline has no original to
# forward to, and the program frees less. W2, W3 and W4, as bench-quick.
.PHONY: bench-floor
bench-floor: all venvs arrow-venvs floor-lib
	@BENCH_LIB=$(abspath $(FLOOR_LIB)) BENCH_ONLY=icount BENCH_CG_QUICK=1 \
	  BENCH_CG_MEMRAY=0 BENCH_CG_FLOOR=1 BENCH_CG_WORKLOADS=W2,W3,W4s,W4r $(PYTHON) bench/run.py

# PREFIX/bin/capsan, PREFIX/lib/libcapsan.so, and the package with its
# dist-info (pytest11 entry point, RECORD) in $(PYTHON)'s site directory for
# PREFIX (pyhook/install_tree.py --print-site says which)
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib
	install -m 755 $(B)/bin/capsan $(DESTDIR)$(PREFIX)/bin/capsan
	install -m 755 $(B)/lib/libcapsan.so $(DESTDIR)$(PREFIX)/lib/libcapsan.so
	$(PYTHON) pyhook/install_tree.py --prefix '$(PREFIX)' --destdir '$(DESTDIR)' --build $(B)

# ---- hardening (docs/hardening.md) ------------------------------------------
# build/fuzz: `capsan report` as a libFuzzer target (tests/fuzz/fuzz_report.c)
# under ASan+UBSan, built with Debian's clang; build/asan: the CLI, the unit
# tests and the runtime under ASan+UBSan (gcc); build/ubsan: the runtime
# under UBSan, with a copy of the ASan CLI beside it so that its `capsan run`
# preloads that runtime. -fno-sanitize-recover=all: any report fails the run.
FUZZ_CC      ?= clang-14
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= 1
SAN_CC       ?= gcc
FZ           := $(B)/fuzz
# gcc leaves float-cast-overflow out of "undefined" (clang does not): named
UBSAN        := -fsanitize=undefined,float-cast-overflow
SAN_FLAGS    := -fsanitize=address $(UBSAN) -fno-sanitize-recover=all
SAN_CFLAGS   := -O1 -g -std=c11 -D_GNU_SOURCE $(WARN) -fno-omit-frame-pointer -Imodel
HDRS         := $(wildcard preload/*.h preload/*/*.h preload/*/*.inc model/*.h model/*.inc reports/*.h)
FUZZ_OBJ     := $(patsubst %.c,$(FZ)/obj/%.o,tests/fuzz/fuzz_report.c $(CLI_SRC) $(MODEL_SRC))
ASAN_CLI_OBJ := $(patsubst $(B)/obj/%,$(B)/asan/obj/%,$(CLI_OBJ))
ASAN_RT_OBJ  := $(patsubst $(B)/obj/%,$(B)/asan/obj/%,$(RT_OBJ))
UBSAN_RT_OBJ := $(patsubst $(B)/obj/%,$(B)/ubsan/obj/%,$(RT_OBJ))
ASAN_UNIT    := $(patsubst tests/unit/%.c,$(B)/asan/tests/unit/%,$(UNIT_SRC))
FUZZ_RUN     := -timeout=30 -rss_limit_mb=2048 -max_len=65536 -close_fd_mask=3 \
                -dict=$(CURDIR)/tests/fuzz/trace.dict
.PHONY: fuzz fuzz-build fuzz-regress sanitizers test-san asan

# cli.c's main() would clash with libFuzzer's: it is renamed there. The
# reader's limits are small, so that 64 KiB inputs reach downsampling (past
# 2000 COUNTS points) and spilling (past 4096 findings).
$(FZ)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(SAN_CFLAGS) -Ireports -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
	  -DCS_COUNTS_MAX=16 -DFMEM_MAX=8 $(if $(filter reports/cli.c,$<),-Dmain=cs_cli_main) -c $< -o $@
$(FZ)/fuzz_report: $(FUZZ_OBJ)
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -Wl,--wrap=cs_sym_cleanup -o $@ $(FUZZ_OBJ) $(CLI_LIBS)
fuzz-build: $(FZ)/fuzz_report

# real traces of every finding kind (and truncated ones), made anew when the
# runtime or the scenarios change; never committed
$(FZ)/seeds/.done: tests/fuzz/seeds.py $(B)/bin/capsan $(B)/lib/libcapsan.so $(FIX_SO) $(wildcard tests/scenarios/*.py)
	@rm -rf $(FZ)/seeds
	$(PYTHON) tests/fuzz/seeds.py $(FZ)/seeds
	@touch $@

# make fuzz FUZZ_SECONDS=N [FUZZ_JOBS=2]: new inputs go to build/fuzz/corpus,
# crashes to build/fuzz/artifacts (minimize each with -minimize_crash=1 into
# tests/fuzz/regressions); with FUZZ_JOBS=N, N processes each fuzz for
# FUZZ_SECONDS (logs in build/fuzz/fuzz-*.log). Inputs are cut at 64 KiB:
# the NumPy seeds are ~190 KiB, and the whole-size ones ran 20 times slower.
fuzz: all fixtures $(FZ)/fuzz_report $(FZ)/seeds/.done
	@mkdir -p $(FZ)/corpus $(FZ)/artifacts
	cd $(FZ) && nice -n 19 ./fuzz_report $(FUZZ_RUN) -max_total_time=$(FUZZ_SECONDS) \
	  $(if $(filter-out 1,$(FUZZ_JOBS)),-jobs=$(FUZZ_JOBS) -workers=$(FUZZ_JOBS)) \
	  -artifact_prefix=artifacts/ corpus seeds $(CURDIR)/tests/fuzz/regressions

# every input that once found a bug, run once each (make test)
fuzz-regress: $(FZ)/fuzz_report
	@$(FZ)/fuzz_report $(FUZZ_RUN) tests/fuzz/regressions/* > $(FZ)/regress.log 2>&1 \
	  || { cat $(FZ)/regress.log; exit 1; }
	@echo "fuzz regressions: $$(ls tests/fuzz/regressions | wc -l) input(s) replayed clean"

$(B)/asan/obj/cli/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_CFLAGS) -Ireports $(SAN_FLAGS) -c $< -o $@
$(B)/asan/bin/capsan: $(ASAN_CLI_OBJ)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_FLAGS) -o $@ $(ASAN_CLI_OBJ) $(CLI_LIBS)
ASAN_MODEL_OBJ := $(patsubst %.c,$(B)/asan/obj/cli/%.o,$(MODEL_SRC))
$(B)/asan/tests/unit/%: tests/unit/%.c tests/unit/check.h preload/core/names.h preload/core/probe.c preload/core/probe.h \
    $(ASAN_MODEL_OBJ)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_CFLAGS) -Ipreload/core $(SAN_FLAGS) -o $@ $< preload/core/probe.c $(ASAN_MODEL_OBJ)
$(B)/asan/obj/rt/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_CFLAGS) $(RT_INC) $(SAN_FLAGS) -fPIC -fvisibility=hidden -c $< -o $@
$(B)/asan/lib/libcapsan.so: $(ASAN_RT_OBJ) preload/exports.map
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_FLAGS) -shared -o $@ $(ASAN_RT_OBJ) -Wl,--version-script=preload/exports.map \
	  -Wl,-z,now -Wl,--no-undefined -ldl -lpthread
$(B)/ubsan/obj/rt/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_CFLAGS) $(RT_INC) $(UBSAN) -fno-sanitize-recover=all -fPIC -fvisibility=hidden -DCS_OWNHEAP -c $< -o $@
$(B)/ubsan/lib/libcapsan.so: $(UBSAN_RT_OBJ) preload/exports.map
	@mkdir -p $(dir $@)
	$(SAN_CC) $(UBSAN) -shared -o $@ $(UBSAN_RT_OBJ) -Wl,--version-script=preload/exports.map \
	  -Wl,-z,now -Wl,--no-undefined -ldl -lpthread
$(B)/ubsan/bin/capsan: $(B)/asan/bin/capsan
	@mkdir -p $(dir $@)
	cp $< $@

sanitizers: $(B)/asan/bin/capsan $(ASAN_UNIT) $(B)/ubsan/lib/libcapsan.so $(B)/ubsan/bin/capsan \
    $(B)/asan/lib/libcapsan.so

# make test's share: the unit tests under ASan+UBSan (test_sanitizers.py
# runs the rest: the runtime under UBSan, the CLI over its traces)
test-san: sanitizers
	@for t in $(ASAN_UNIT); do $$t > /dev/null || { echo "$$t failed under ASan+UBSan"; exit 1; }; done
	@echo "unit tests under ASan+UBSan: $(words $(ASAN_UNIT)) passed"

# the runtime under ASan (libasan preloaded first) over the DLPack and NumPy scenarios
asan: all fixtures sanitizers
	@cd tests && CAPSAN_SAN_ASAN=1 $(PYTHON) -m pytest -q -p no:cacheprovider test_sanitizers.py -k test_asan_runtime $(PYTEST_ARGS)

# ---- stress (issue 14) -------------------------------------------------------
# tests/stress: threads, NEP 49 handler switches, fork while exporting,
# dlclose and a new library at the same address, deleters after
# Py_Finalize, capsule names unterminated at a page end, a program that
# closes every descriptor. Its C parts are built like the fixtures, per
# interpreter, into FIXOUT/stress: st_*.c are Python extensions, and
# st_reload.c is built twice (libst_reload_a.so, libst_reload_b.so: one
# code, one layout) to be loaded with ctypes and unloaded. `make test`
# runs tests/test_stress.py small (CAPSAN_STRESS_SCALE=1); `make stress`
# runs it STRESS_RUNS times in a row at STRESS_SCALE and stops at the
# first failure (each pass's pytest output: build/stress/pass-N.log).
STRESS_RUNS  ?= 20
STRESS_SCALE ?= 16
STRESS_EXT   := $(filter-out tests/stress/st_reload.c,$(wildcard tests/stress/st_*.c))
STRESS_SO    := $(patsubst tests/stress/%.c,$(FIXOUT)/stress/%.so,$(STRESS_EXT)) \
                $(FIXOUT)/stress/libst_reload_a.so $(FIXOUT)/stress/libst_reload_b.so
.PHONY: stress
$(FIXOUT)/stress/st_%.so: tests/stress/st_%.c tests/fixtures/fx_dlpack.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -I$(PYINC) -o $@ $<
$(FIXOUT)/stress/libst_reload_a.so: tests/stress/st_reload.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -I$(PYINC) -DST_TAG=65 -o $@ $<
$(FIXOUT)/stress/libst_reload_b.so: tests/stress/st_reload.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -I$(PYINC) -DST_TAG=66 -o $@ $<
fixtures: $(STRESS_SO)
fixture-sos: $(STRESS_SO)

stress: all fixtures fixtures-current
	@mkdir -p $(B)/stress
	@passed=0; start=$$(date +%s); \
	for i in $$(seq 1 $(STRESS_RUNS)); do \
	  t0=$$(date +%s%N); \
	  (cd tests && CAPSAN_STRESS_SCALE=$(STRESS_SCALE) $(PYTHON) -m pytest -q -p no:cacheprovider \
	    -x test_stress.py $(PYTEST_ARGS)) > $(B)/stress/pass-$$i.log 2>&1; rc=$$?; \
	  ds=$$(( ($$(date +%s%N) - t0) / 100000000 )); secs=$$((ds / 10)).$$((ds % 10)); \
	  if [ $$rc -ne 0 ]; then \
	    cat $(B)/stress/pass-$$i.log; \
	    echo "stress: pass $$i FAILED after $${secs}s; $$passed of $(STRESS_RUNS) passes ok"; exit 1; \
	  fi; \
	  passed=$$((passed + 1)); \
	  echo "stress: pass $$i/$(STRESS_RUNS) ok in $${secs}s: $$(tail -n 1 $(B)/stress/pass-$$i.log)"; \
	done; \
	echo "stress: $$passed of $(STRESS_RUNS) passes ok (scale $(STRESS_SCALE), $$(( $$(date +%s) - start ))s in all)"

# ---- free-threaded stress (issue 43) ----------------------------------------
# tests/test_ft_stress.py: 8 threads of numpy and pyarrow exchanging DLPack
# tensors and Arrow streams on the free-threaded 3.13t, the GIL off. make
# test runs it for 5 s; this runs it FT_RUNS times for FT_SECONDS each with
# a CPU hog on every core beside it (test_repeat.py's) and stops at the
# first failure (each pass's pytest output: build/stress-ft/pass-N.log).
FT_RUNS    ?= 20
FT_SECONDS ?= 60
.PHONY: stress-ft
stress-ft: all fixtures newest
	@mkdir -p $(B)/stress-ft
	@passed=0; start=$$(date +%s); \
	for i in $$(seq 1 $(FT_RUNS)); do \
	  t0=$$(date +%s); \
	  (cd tests && CAPSAN_FT_SECONDS=$(FT_SECONDS) CAPSAN_FT_HOG=1 $(PYTHON) -m pytest -q \
	    -p no:cacheprovider -x -rs -s test_ft_stress.py -k exchanges_report_nothing $(PYTEST_ARGS)) > $(B)/stress-ft/pass-$$i.log 2>&1; rc=$$?; \
	  secs=$$(( $$(date +%s) - t0 )); \
	  if [ $$rc -ne 0 ] || grep -q skipped $(B)/stress-ft/pass-$$i.log; then \
	    cat $(B)/stress-ft/pass-$$i.log; \
	    echo "stress-ft: pass $$i FAILED after $${secs}s; $$passed of $(FT_RUNS) passes ok"; exit 1; \
	  fi; \
	  passed=$$((passed + 1)); \
	  echo "stress-ft: pass $$i/$(FT_RUNS) ok in $${secs}s: $$(grep -o 'ft stress:.*' $(B)/stress-ft/pass-$$i.log)"; \
	done; \
	echo "stress-ft: $$passed of $(FT_RUNS) passes ok ($(FT_SECONDS) s each, $$(( $$(date +%s) - start ))s in all)"

clean:
	rm -rf $(B)
