# kvpager - plain GNU make, no configure step.
#
#   make                 libkvpager (static and shared), the preload shim, tools
#                        (and tests/progs/touch_pages, which kvpbench touch runs)
#   make check           build and run every test (tests/run-tests.sh)
#   make demo            the main job on its default (a temporary backing file)
#   make bench           the benchmarks, short form
#   make install         PREFIX=/usr/local DESTDIR=
#   make SANITIZE=address,undefined check   (or SANITIZE=thread) into build-<san>/
#   make fuzz            the libFuzzer harnesses, FUZZ_SECONDS each, into build-fuzz/
#   make V=1             show the commands
#   PYTHONPATH=build/python /usr/bin/python3    the Python binding, built
#
# Sources are found by folder: kmod-helpers/, pager/ and lib/<subsystem>/
# make libkvpager; lib/preload/ the LD_PRELOAD shim; tools/X.c (or tools/X/*.c)
# the program X; tests/test_*.c one test binary each; tests/progs/*.c plain
# programs that know nothing of kvpager; lib/cuda/*.cu the CUDA objects.

PREFIX ?= /usr/local
DESTDIR ?=
CC ?= cc
CFLAGS ?= -O2 -g
LDFLAGS ?=
SANITIZE ?=
VERSION := 0.1.0
SOVERSION := 0

comma := ,
ifeq ($(SANITIZE),)
BUILD ?= build
else
BUILD ?= build-$(subst $(comma),-,$(SANITIZE))
# A sanitizer's report fails the test that triggers it (UBSan would go on).
override CFLAGS += -fsanitize=$(SANITIZE) -fno-sanitize-recover=all \
	-fno-omit-frame-pointer
override LDFLAGS += -fsanitize=$(SANITIZE)
endif

ifeq ($(V),1)
Q :=
msg = @true
else
Q := @
msg = @printf '  %-6s %s\n' $(1) $(2)
endif

DEPS_PKGS := fuse3 liburing check libsodium libcrypto hiredis libmicrohttpd \
	libxxhash
# redis-server (and redis-tools: redis-cli, redis-benchmark) for the remote
# tier's tests and kvpbench tier, which start their own servers; curl and
# python3-prometheus-client for the /metrics tests; gnuplot-nox for
# kvpbench's and kvpager run's --plot (run, not linked) and their test.
DEBIAN_PKGS := libfuse3-dev fuse3 liburing-dev check pkg-config libsodium-dev libssl-dev \
	libxxhash-dev \
	python3-numpy python3-pytest libhiredis-dev redis-server redis-tools \
	libmicrohttpd-dev curl python3-prometheus-client gnuplot-nox
# The Python binding's interpreter: Debian's, which sees Debian's numpy.
PYTHON ?= /usr/bin/python3
# Expanded when a recipe runs, after the deps stamp has installed them.
PKG_CFLAGS = $(shell pkg-config --cflags $(DEPS_PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs fuse3 liburing libsodium libcrypto hiredis libmicrohttpd \
	libxxhash 2>/dev/null)
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null)

override CFLAGS += -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -fPIC \
	-pthread -Wall -Wextra -Wno-unused-parameter -Wno-type-limits -Wshadow \
	-Wstrict-prototypes -Wmissing-prototypes -I. -MMD -MP
override LDFLAGS += -pthread

# lib/ has one folder per subsystem; the shim and the CUDA code build apart.
LIB_SUBSYS_SRCS := $(filter-out lib/preload/% lib/cuda/%,$(wildcard lib/*/*.c))
LIB_SRCS := $(sort $(wildcard kmod-helpers/*.c pager/*.c lib/*.c) $(LIB_SUBSYS_SRCS))
# Public headers: every lib/ header but the shim's, the devices' (they
# include lib/cuda/'s, which are not installed) and the *_i.h.
LIB_PUBLIC_HDRS := $(filter-out lib/kvpager.h lib/preload/% lib/cuda/% \
	lib/device/% %_i.h,\
	$(wildcard lib/*.h lib/*/*.h))
PRELOAD_SRCS := $(sort $(wildcard lib/preload/*.c))
TOOL_SINGLE := $(sort $(wildcard tools/*.c))
TOOL_DIRS := $(sort $(patsubst %/,%,$(dir $(wildcard tools/*/*.c))))
TEST_SRCS := $(sort $(wildcard tests/test_*.c))
TEST_HELPER_SRCS := $(sort $(wildcard tests/helpers/*.c))
PROG_SRCS := $(sort $(wildcard tests/progs/*.c))
CUDA_SRCS := $(sort $(wildcard lib/cuda/*.cu))
# The Python package, built into $(BUILD)/python/kvpager with _abi.py.
PY_SRCS := $(sort $(wildcard python/kvpager/*.py))
PY_PKG := $(PY_SRCS:python/%=$(BUILD)/python/%) \
	$(BUILD)/python/kvpager/_abi.py
# tests/fuzz/<name>.c: a libFuzzer harness, corpus in tests/fuzz/<name>/.
FUZZ_NAMES := $(filter-out replay,$(basename $(notdir $(wildcard tests/fuzz/*.c))))

LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
PRELOAD_OBJS := $(PRELOAD_SRCS:%.c=$(BUILD)/obj/%.o)
TEST_HELPER_OBJS := $(TEST_HELPER_SRCS:%.c=$(BUILD)/obj/%.o)
TOOLS := $(patsubst tools/%.c,$(BUILD)/bin/%,$(TOOL_SINGLE)) \
	$(patsubst tools/%,$(BUILD)/bin/%,$(TOOL_DIRS))
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
PROGS := $(patsubst tests/progs/%.c,$(BUILD)/tests/progs/%,$(PROG_SRCS))
FUZZ_REPLAYS := $(FUZZ_NAMES:%=$(BUILD)/tests/test_fuzz_%)

STATIC_LIB := $(BUILD)/lib/libkvpager.a
SHARED_LIB := $(BUILD)/lib/libkvpager.so.$(VERSION)
PRELOAD_LIB := $(BUILD)/lib/libkvpager-preload.so
PC_FILE := $(BUILD)/lib/kvpager.pc
DEPS_STAMP := $(BUILD)/.deps-ok

NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) \
	$(wildcard /usr/local/cuda/bin/nvcc))
NVCCFLAGS ?= -O2
ifneq ($(NVCC),)
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/obj/%.o)
# The .so is what --device cuda loads (dlopen; the CUDA runtime linked
# in statically); the .a is for programs that link the kernels themselves.
CUDA_LIB := $(if $(CUDA_SRCS),$(BUILD)/lib/libkvpager-cuda.a \
	$(BUILD)/lib/libkvpager-cuda.so)
endif

# Man pages and bash completion: the tools' option tables (TOOL
# --cli-table, lib/cli/cli.h) put into man/*.in by man/gen.py.
MAN_TOOLS := kvpager.1 kvpbench.1 kvpctl.8 kvp-probe.8
MAN_PAGES := $(MAN_TOOLS:%=$(BUILD)/man/%) $(BUILD)/man/kvpager-tunables.7 \
	$(BUILD)/man/libkvpager.3
COMPLETIONS := $(basename $(MAN_TOOLS:%=$(BUILD)/completion/%))

# What kvpbench touch runs (its mmap and preload lines), beside the tools:
# installed into PREFIX/libexec/kvpager/, where the installed kvpbench
# finds it.
LIBEXEC_PROGS := $(BUILD)/tests/progs/touch_pages

ALL := $(STATIC_LIB) $(SHARED_LIB) $(if $(PRELOAD_SRCS),$(PRELOAD_LIB)) \
	$(PC_FILE) $(TOOLS) $(LIBEXEC_PROGS) $(CUDA_LIB) $(PY_PKG) \
	$(MAN_PAGES) $(COMPLETIONS)

.SECONDARY:
.PHONY: all check demo bench install uninstall clean deps format fuzz fuzz-bins
all: $(ALL)
ifeq ($(NVCC),)
	@echo "  CUDA   skipped: nvcc not found on PATH or at /usr/local/cuda/bin/nvcc"
endif

# The Debian packages the build needs: installed when missing and we are
# root, else the one command to run is printed.
# $(call apt_get_install,PKGS): shell text that does so for PKGS.
apt_get_install = \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "kvpager: installing $(1) with apt-get"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			$(1) || { apt-get update -q && \
			DEBIAN_FRONTEND=noninteractive apt-get install \
			-y -q $(1); }; } >$(@D)/.deps.log 2>&1 \
		|| { cat $(@D)/.deps.log; \
		     echo "kvpager: apt-get failed; see above"; exit 1; }; \
	else \
		echo "kvpager: run: sudo apt-get install -y $(1)"; \
		exit 1; \
	fi
deps: $(DEPS_STAMP)
$(DEPS_STAMP):
	$(Q)missing=""; \
	command -v pkg-config >/dev/null 2>&1 || missing="pkg-config"; \
	for p in $(DEPS_PKGS); do \
		pkg-config --exists $$p 2>/dev/null || missing="$$missing $$p"; \
	done; \
	command -v fusermount3 >/dev/null 2>&1 || missing="$$missing fusermount3"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-benchmark >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
	command -v gnuplot >/dev/null 2>&1 || missing="$$missing gnuplot-nox"; \
	$(PYTHON) -c 'import numpy, pytest, prometheus_client' >/dev/null 2>&1 || \
		missing="$$missing python3-numpy/python3-pytest/python3-prometheus-client"; \
	if [ -n "$$missing" ]; then \
		echo "kvpager: missing build dependencies:$$missing"; \
		$(call apt_get_install,$(DEBIAN_PKGS)); \
	fi; \
	touch $@

# Checked again when the Makefile (its list of packages) changes.
$(DEPS_STAMP): Makefile
$(BUILD)/.dir-stamp:
	$(Q)mkdir -p $(BUILD) && touch $@
$(DEPS_STAMP): | $(BUILD)/.dir-stamp

$(BUILD)/obj/%.o: %.c | $(DEPS_STAMP)
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) $(PKG_CFLAGS) -c -o $@ $<

$(BUILD)/obj/%.o: %.cu | $(DEPS_STAMP)
	$(call msg,NVCC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) $(NVCCFLAGS) -I. -Xcompiler -fPIC -c -o $@ $<

$(STATIC_LIB): $(LIB_OBJS)
	$(call msg,AR,$@)
	$(Q)mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(SHARED_LIB): $(LIB_OBJS)
	$(call msg,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) -shared -Wl,-soname,libkvpager.so.$(SOVERSION) $(LDFLAGS) \
		-o $@ $^ $(PKG_LIBS) -lm
	$(Q)ln -sf libkvpager.so.$(VERSION) $(BUILD)/lib/libkvpager.so.$(SOVERSION)
	$(Q)ln -sf libkvpager.so.$(SOVERSION) $(BUILD)/lib/libkvpager.so

$(PRELOAD_LIB): $(PRELOAD_OBJS) $(LIB_OBJS)
	$(call msg,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) -shared $(LDFLAGS) -o $@ $^ $(PKG_LIBS) -ldl -lm

$(BUILD)/lib/libkvpager-cuda.a: $(CUDA_OBJS)
	$(call msg,AR,$@)
	$(Q)mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/lib/libkvpager-cuda.so: $(CUDA_OBJS)
	$(call msg,NVLD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) $(NVCCFLAGS) -shared -cudart static -o $@ $^

$(PC_FILE): lib/kvpager.pc.in Makefile
	$(Q)mkdir -p $(@D)
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' $< >$@

# The Python package: its sources, and _abi.py printed by python/gen_abi.c
# (the statistics, tunables and structure layouts of the C headers).
$(BUILD)/python/kvpager/%.py: python/kvpager/%.py
	$(Q)mkdir -p $(@D)
	$(Q)cp $< $@

$(BUILD)/python/gen_abi: $(BUILD)/obj/python/gen_abi.o
	$(call msg,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $<

$(BUILD)/python/kvpager/_abi.py: $(BUILD)/python/gen_abi
	$(call msg,GEN,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$< >$@.tmp && mv $@.tmp $@

$(BUILD)/man/%.table: $(BUILD)/bin/%
	$(Q)mkdir -p $(@D)
	$(Q)$< --cli-table >$@.tmp && mv $@.tmp $@

$(BUILD)/man/%.1: man/%.1.in $(BUILD)/man/%.table man/gen.py
	$(call msg,GEN,$@)
	$(Q)$(PYTHON) man/gen.py man $< $(BUILD)/man/$*.table >$@.tmp && mv $@.tmp $@

$(BUILD)/man/%.8: man/%.8.in $(BUILD)/man/%.table man/gen.py
	$(call msg,GEN,$@)
	$(Q)$(PYTHON) man/gen.py man $< $(BUILD)/man/$*.table >$@.tmp && mv $@.tmp $@

# The registry as kvpctl lists it with no pager running (an empty registry).
$(BUILD)/man/kvpager-tunables.7: man/kvpager-tunables.7.in $(BUILD)/bin/kvpctl man/gen.py
	$(call msg,GEN,$@)
	$(Q)KVP_RUNTIME_DIR=$(BUILD)/man/no-registry $(BUILD)/bin/kvpctl list \
		>$(BUILD)/man/tunables.txt
	$(Q)$(PYTHON) man/gen.py tunables $< $(BUILD)/man/tunables.txt >$@.tmp && mv $@.tmp $@

$(BUILD)/man/libkvpager.3: man/libkvpager.3
	$(Q)mkdir -p $(@D)
	$(Q)cp $< $@

$(BUILD)/completion/%: $(BUILD)/man/%.table man/gen.py
	$(call msg,GEN,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(PYTHON) man/gen.py completion $* $< >$@.tmp && mv $@.tmp $@

# tools/X.c -> bin/X
$(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(STATIC_LIB)
	$(call msg,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(STATIC_LIB) $(PKG_LIBS) -lm

# tools/X/*.c -> bin/X (an explicit rule per folder wins over the pattern)
define TOOL_DIR_RULE
$(BUILD)/bin/$(notdir $(1)): $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard $(1)/*.c)) $(STATIC_LIB)
	$$(call msg,LD,$$@)
	$(Q)mkdir -p $$(@D)
	$(Q)$$(CC) $$(LDFLAGS) -o $$@ $$(filter %.o,$$^) $$(STATIC_LIB) $$(PKG_LIBS) -lm
endef
$(foreach d,$(TOOL_DIRS),$(eval $(call TOOL_DIR_RULE,$(d))))

$(BUILD)/tests/test_%: $(BUILD)/obj/tests/test_%.o $(TEST_HELPER_OBJS) $(STATIC_LIB)
	$(call msg,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(STATIC_LIB) \
		$(CHECK_LIBS) $(PKG_LIBS) -lm

# Programs that know nothing of kvpager: no library, no project headers.
$(BUILD)/tests/progs/%: tests/progs/%.c | $(DEPS_STAMP)
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) -O2 -g -std=c11 -D_GNU_SOURCE -pthread $(filter -fsanitize=%,$(CFLAGS)) -o $@ $<

# failfs is a FUSE filesystem (its writes fail on demand): it needs libfuse.
$(BUILD)/tests/progs/failfs: tests/progs/failfs.c | $(DEPS_STAMP)
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) -O2 -g -std=c11 -D_GNU_SOURCE -pthread $(filter -fsanitize=%,$(CFLAGS)) \
		$(shell pkg-config --cflags fuse3) -o $@ $< $(shell pkg-config --libs fuse3)

$(BUILD)/tests/test_fuzz_%: $(BUILD)/obj/tests/fuzz/%.o \
		$(BUILD)/obj/tests/fuzz/replay.o $(STATIC_LIB)
	$(call msg,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(STATIC_LIB) $(PKG_LIBS) -lm

check: $(ALL) $(TESTS) $(PROGS) $(FUZZ_REPLAYS)
	$(Q)BUILD=$(BUILD) tests/run-tests.sh

# The probe's lines print whole with V=1 or when the pager cannot run;
# otherwise only those not "ok" and the verdict.
demo: $(ALL)
	$(Q)if $(BUILD)/bin/kvp-probe >$(BUILD)/probe.txt 2>&1 && [ "$(V)" != 1 ]; \
	then grep -v -E '^.{27}ok ' $(BUILD)/probe.txt; \
	echo "(make demo V=1 shows every check of kvp-probe)"; \
	else cat $(BUILD)/probe.txt; fi
	$(Q)if [ -x $(BUILD)/bin/kvpager ]; then $(BUILD)/bin/kvpager run; fi

bench: $(ALL)
	$(Q)$(BUILD)/bin/kvpbench --short

# make fuzz: each harness under libFuzzer, ASan and UBSan for FUZZ_SECONDS,
# starting from its committed corpus; what it learns stays in build-fuzz/.
# A finding stops the run and leaves the input in build-fuzz/crashes/:
# fix the bug, then commit the input into tests/fuzz/<name>/ so that
# `make check` replays it.  clang is needed only here, installed as the
# build's other packages are.
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang-14
FUZZ_DEBIAN_PKGS := clang-14 libclang-rt-14-dev
FUZZ_BUILD := build-fuzz
FUZZ_DEPS_STAMP := $(FUZZ_BUILD)/.fuzz-deps-ok
# What the harnesses call, built with coverage: the engine, the tunables,
# the view's tree, the block tables, the cache directory and the remote
# tier (the view shows their figures); not the rest of lib/kv/, whose SIMD
# checks clang-14 does not know.
FUZZ_LIB_SRCS := $(wildcard kmod-helpers/*.c pager/*.c lib/tunables/*.c) \
	lib/view/view_tree.c lib/view/prom.c lib/kv/block_table.c \
	lib/cache/cache_dir.c lib/cache/block_record.c \
	$(wildcard lib/remote/*.c)
FUZZ_LIB := $(FUZZ_BUILD)/lib/libkvpager-fuzz.a

$(FUZZ_DEPS_STAMP):
	$(Q)mkdir -p $(@D)
	$(Q)if ! printf 'int LLVMFuzzerTestOneInput(const char *d, long n)\n{ return 0; }\n' | \
		$(FUZZ_CC) -x c -fsanitize=fuzzer -o /dev/null - >/dev/null 2>&1; then \
		echo "kvpager: make fuzz needs $(FUZZ_CC) with libFuzzer"; \
		$(call apt_get_install,$(FUZZ_DEBIAN_PKGS)); \
	fi; \
	touch $@

# Built by a make of its own: every object needs clang's coverage flags.
fuzz: $(FUZZ_DEPS_STAMP)
	$(Q)$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) \
		SANITIZE=fuzzer-no-link,address,undefined fuzz-bins
	$(Q)for f in $(FUZZ_NAMES); do \
		mkdir -p $(FUZZ_BUILD)/corpus/$$f $(FUZZ_BUILD)/crashes; \
		$(FUZZ_BUILD)/fuzz/$$f -max_total_time=$(FUZZ_SECONDS) \
			-timeout=10 -print_final_stats=1 \
			-artifact_prefix=$(FUZZ_BUILD)/crashes/$$f- \
			$(FUZZ_BUILD)/corpus/$$f tests/fuzz/$$f \
			>$(FUZZ_BUILD)/$$f.log 2>&1; \
		rc=$$?; \
		runs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $(FUZZ_BUILD)/$$f.log); \
		if [ $$rc != 0 ]; then \
			tail -n 40 $(FUZZ_BUILD)/$$f.log; \
			echo "fuzz: $$f: finding after $${runs:-?} runs, input in $(FUZZ_BUILD)/crashes/"; \
			exit 1; \
		fi; \
		printf '  FUZZ   %-12s %10s runs in %ss, corpus %s inputs\n' $$f "$$runs" \
			$(FUZZ_SECONDS) "$$(ls $(FUZZ_BUILD)/corpus/$$f | wc -l)"; \
	done

fuzz-bins: $(FUZZ_NAMES:%=$(BUILD)/fuzz/%)

$(FUZZ_LIB): $(FUZZ_LIB_SRCS:%.c=$(BUILD)/obj/%.o)
	$(call msg,AR,$@)
	$(Q)mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(FUZZ_LIB)
	$(call msg,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(PKG_LIBS) -lm

# The .pc is generated at install, not copied: the build's may name another
# PREFIX.  The Python package goes where Debian's python3 looks for PREFIX
# (dist-packages), with _installed.py naming the library's directory.
PY_VERSION = $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PY_SITEDIR ?= $(if $(filter /usr,$(PREFIX)),$(PREFIX)/lib/python3/dist-packages,$(PREFIX)/lib/python$(PY_VERSION)/dist-packages)
install: $(ALL)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
		$(DESTDIR)$(PREFIX)/include/kvpager/pager
	install -m 0755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/libexec/kvpager
	install -m 0755 $(LIBEXEC_PROGS) $(DESTDIR)$(PREFIX)/libexec/kvpager/
	install -m 0644 $(STATIC_LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(SHARED_LIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libkvpager.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libkvpager.so.$(SOVERSION)
	ln -sf libkvpager.so.$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/libkvpager.so
	$(if $(PRELOAD_SRCS),install -m 0755 $(PRELOAD_LIB) $(DESTDIR)$(PREFIX)/lib/)
	$(if $(CUDA_LIB),install -m 0755 $(BUILD)/lib/libkvpager-cuda.so $(DESTDIR)$(PREFIX)/lib/)
	install -m 0644 lib/kvpager.h $(DESTDIR)$(PREFIX)/include/kvpager/
	install -m 0644 pager/config.h pager/stats.h pager/store.h pager/pager.h \
		$(DESTDIR)$(PREFIX)/include/kvpager/pager/
	for h in $(LIB_PUBLIC_HDRS); do \
		install -D -m 0644 $$h $(DESTDIR)$(PREFIX)/include/kvpager/$$h || exit 1; \
	done
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
		lib/kvpager.pc.in >$(DESTDIR)$(PREFIX)/lib/pkgconfig/kvpager.pc
	chmod 0644 $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvpager.pc
	for m in $(MAN_PAGES); do \
		sec=$${m##*.}; \
		install -D -m 0644 $$m $(DESTDIR)$(PREFIX)/share/man/man$$sec/$${m##*/} || exit 1; \
	done
	install -d $(DESTDIR)$(PREFIX)/share/bash-completion/completions
	install -m 0644 $(COMPLETIONS) $(DESTDIR)$(PREFIX)/share/bash-completion/completions/
	install -d $(DESTDIR)$(PY_SITEDIR)/kvpager
	install -m 0644 $(PY_PKG) $(DESTDIR)$(PY_SITEDIR)/kvpager/
	echo 'LIBDIR = "$(PREFIX)/lib"' >$(DESTDIR)$(PY_SITEDIR)/kvpager/_installed.py

uninstall:
	rm -rf $(DESTDIR)$(PREFIX)/include/kvpager
	rm -f $(DESTDIR)$(PREFIX)/lib/libkvpager* \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig/kvpager.pc
	rm -f $(patsubst $(BUILD)/bin/%,$(DESTDIR)$(PREFIX)/bin/%,$(TOOLS))
	rm -rf $(DESTDIR)$(PREFIX)/libexec/kvpager
	rm -rf $(DESTDIR)$(PY_SITEDIR)/kvpager
	rm -f $(foreach m,$(MAN_PAGES),$(DESTDIR)$(PREFIX)/share/man/man$(subst .,,$(suffix $(m)))/$(notdir $(m)))
	rm -f $(COMPLETIONS:$(BUILD)/completion/%=$(DESTDIR)$(PREFIX)/share/bash-completion/completions/%)

format:
	clang-format -i $(wildcard */*.c */*.h lib/*/*.c lib/*/*.h)

clean:
	rm -rf build build-*

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
