# capsan — build everything into build/, usable from the checkout.
#   make            build libcapsan.so, the capsan CLI, the Python package
#   make demo       install what is missing, build, run a buggy example under capsan
#   make test       install what is missing, build, run the whole test suite
#   make bench      overhead benchmarks (ratios against a plain run)
#   make install PREFIX=/usr/local

PREFIX   ?= /usr/local
PYTHON   ?= /usr/bin/python3
CC       ?= cc
B        := build
PYINC    := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
NPINC    := $(shell $(PYTHON) -c 'import numpy; print(numpy.get_include())' 2>/dev/null)
WARN     := -Wall -Wextra -Werror
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -D_GNU_SOURCE $(WARN) -fno-omit-frame-pointer
# the runtime: PIC, hidden by default (only capsan_* is exported), no libpython
# link and no Python headers: one build serves every CPython (pyversions.inc)
RT_CFLAGS := $(CFLAGS) -fPIC -fvisibility=hidden -Ipreload -Ireports
RT_SHARED := reports/render.c reports/suppress.c reports/json.c reports/leakgroups.c
RT_SRC   := $(wildcard preload/*.c) $(RT_SHARED)
RT_OBJ   := $(patsubst %.c,$(B)/obj/rt/%.o,$(RT_SRC))
# the report tool
CLI_SRC  := $(filter-out $(RT_SHARED),$(wildcard reports/*.c))
CLI_OBJ  := $(patsubst %.c,$(B)/obj/cli/%.o,$(CLI_SRC) preload/lifecycle.c preload/options.c $(RT_SHARED))
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
all: $(B)/lib/libcapsan.so $(B)/bin/capsan python

$(B)/obj/rt/%.o: %.c $(wildcard preload/*.h preload/*.inc reports/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(RT_CFLAGS) -c $< -o $@

$(B)/lib/libcapsan.so: $(RT_OBJ) preload/exports.map
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $(RT_OBJ) -Wl,--version-script=preload/exports.map \
	  -Wl,-z,now -Wl,-z,relro -Wl,--no-undefined -ldl -lpthread

$(B)/obj/cli/%.o: %.c $(wildcard preload/*.h preload/*.inc reports/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ipreload -Ireports -c $< -o $@

$(B)/bin/capsan: $(CLI_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(CLI_OBJ) $(CLI_LIBS)

# the package, and the dist-info that lets pytest autoload its plugin
# (`pytest --capsan` with build/python, or PREFIX/lib/capsan/python, on sys.path)
PY_DIST  := $(B)/python/capsan-0.1.dist-info
python: $(PY_OUT) $(PY_DIST)/METADATA $(PY_DIST)/entry_points.txt
$(B)/python/capsan/%: pyhook/capsan/%
	@mkdir -p $(dir $@)
	cp $< $@
$(PY_DIST)/METADATA: Makefile
	@mkdir -p $(dir $@)
	printf 'Metadata-Version: 2.1\nName: capsan\nVersion: 0.1\nSummary: sanitizer for DLPack capsules and NumPy data memory\n' > $@
$(PY_DIST)/entry_points.txt: Makefile
	@mkdir -p $(dir $@)
	printf '[pytest11]\ncapsan = capsan.pytest_plugin\n' > $@

# buggy and clean fixture extensions used by the tests
$(FIXOUT)/%.so: tests/fixtures/%.c $(wildcard tests/fixtures/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -I$(PYINC) -I$(NPINC) -Ipreload \
	  -DNPY_TARGET_VERSION=NPY_1_22_API_VERSION -o $@ $<

# a shared-libpython interpreter: Debian's /usr/bin/python3 links libpython statically
$(B)/tests/pyshared: tests/pyshared.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(PYINC) -o $@ $< -lpython3.11

$(B)/tests/unit/%: tests/unit/%.c tests/unit/check.h preload/names.h preload/probe.c preload/probe.h $(B)/obj/cli/preload/lifecycle.o $(B)/obj/cli/reports/render.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ipreload -Ireports -o $@ $< preload/probe.c $(B)/obj/cli/preload/lifecycle.o $(B)/obj/cli/reports/render.o

fixtures: $(FIX_SO) $(B)/tests/pyshared $(UNIT_BIN)
fixture-sos: $(FIX_SO)

# The current stack: a venv per CPython 3.10-3.13 (numpy 2; torch 2.13 and
# JAX on 3.11), built once from the package registry and cached outside the
# checkout (.ci/venvs); build/venvs.txt lists "TAG PYTHON" for the tests.
venvs:
	@mkdir -p $(B)
	@bash .ci/venvs > $(B)/venvs.txt.new && mv $(B)/venvs.txt.new $(B)/venvs.txt
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
	@$(MAKE) --no-print-directory all fixtures fixtures-current
	@$(MAKE) --no-print-directory test-c
	@$(MAKE) --no-print-directory test-py

test-c: $(UNIT_BIN)
	@for t in $(UNIT_BIN); do $$t || exit 1; done

test-py:
	@cd tests && $(PYTHON) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# numpy's own test_mem_policy.py and test_dlpack.py under capsan, including
# the slow test_new_policy (the whole numpy core suite through a NEP 49
# handler, > 5 min) that `make test` leaves out
check-numpy: all fixtures
	@cd tests && CAPSAN_CHECK_NUMPY=1 $(PYTHON) -m pytest -q -p no:cacheprovider test_numpy_suites.py $(PYTEST_ARGS)

bench: all fixtures
	@$(PYTHON) bench/run.py

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/lib/capsan/python/capsan
	install -m 755 $(B)/bin/capsan $(DESTDIR)$(PREFIX)/bin/capsan
	install -m 755 $(B)/lib/libcapsan.so $(DESTDIR)$(PREFIX)/lib/libcapsan.so
	cp -r $(B)/python/capsan/. $(DESTDIR)$(PREFIX)/lib/capsan/python/capsan/
	cp -r $(PY_DIST) $(DESTDIR)$(PREFIX)/lib/capsan/python/

clean:
	rm -rf $(B)
