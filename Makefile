# ferry — plain Makefile (the primary build).
#   make            library (static + shared), CLI, tests' binaries
#   make test       the whole suite; last line "N passed, N failed"
#   make test SAN=1 the same under ASan + UBSan (separate build dir)
#   make bench      bench/ (codec sizes and speeds)
#   make fuzz       libFuzzer targets (clang)
#   make install PREFIX=/usr/local
#   NO_NET=1        core only (common, codec, io): no libcurl needed
#   NO_MPI=1        skip lib/loco's MPI part and its programs (automatic
#                   when mpicc is not installed)
CC      ?= cc
PREFIX  ?= /usr/local
SAN     ?=
NO_NET  ?=
FERRY_DATA ?= ../shared/data

# A core-only build lives apart, so that switching NO_NET never mixes
# objects of both kinds in one library.
ifeq ($(NO_NET),1)
BUILD   ?= build-core$(if $(filter 1,$(SAN)),-san)
endif
ifeq ($(SAN),1)
BUILD   ?= build-san
OPT     ?= -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
# a broken invariant (FERRY_ASSERT) aborts here, with the sanitizer's report
CPPFLAGS += -DFERRY_ASSERT_ABORT
LDSAN   := -fsanitize=address,undefined
else
BUILD   ?= build
OPT     ?= -O2 -g
LDSAN   :=
endif

WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-missing-field-initializers
CPPFLAGS += -Iinclude -Ilib -Ilib/common -D_GNU_SOURCE
CFLAGS   += -std=c11 $(OPT) $(WARN) -fPIC -pthread -fvisibility=hidden
LDFLAGS  += $(LDSAN) -pthread

CORE_SRC := $(wildcard lib/common/*.c lib/codec/*.c lib/io/*.c)
NET_SRC  := $(filter-out lib/shard/shard_mpi.c,$(wildcard lib/store/*.c lib/sign/*.c lib/sync/*.c lib/shard/*.c lib/mirror/*.c lib/dock/*.c))
CORE_LIBS := -lzstd -lxxhash -ljansson -lm
ifeq ($(NO_NET),1)
LIB_SRC  := $(CORE_SRC)
LIBS     := $(CORE_LIBS)
CPPFLAGS += -DFERRY_NO_NET
else
LIB_SRC  := $(CORE_SRC) $(NET_SRC)
LIBS     := $(CORE_LIBS) -lcurl -lcrypto
endif
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
# libxxhash's run-time dispatched XXH3 (SSE2/AVX2/AVX-512), where the
# installed library exports it: the same hash values, 2x faster here
XXH_DISPATCH := $(shell printf '\043include <xxh_x86dispatch.h>\nint main(void) { return (int)XXH3_64bits_dispatch("", 0); }\n' | \
                  $(CC) -x c - -o /dev/null -lxxhash >/dev/null 2>&1 && echo 1)
ifeq ($(XXH_DISPATCH),1)
CPPFLAGS += -DFERRY_XXH_DISPATCH=1
endif

CLI_SRC  := $(wildcard programs/ferry/*.c)
ifeq ($(NO_NET),1)
# the store-backed commands (publish, pull, log, gc, compact) need the
# network layers; a core build has diff, apply, inspect and stats
CLI_SRC  := $(filter-out programs/ferry/cmd_publish.c programs/ferry/cmd_pull.c programs/ferry/cmd_log.c \
              programs/ferry/cmd_gc.c programs/ferry/cmd_compact.c programs/ferry/cmd_sync.c,$(CLI_SRC))
endif
# programs/ferry/cmd_shard_mpi.c is build/ferry-shard-mpi's (mpicc), not the CLI's
CLI_SRC  := $(filter-out programs/ferry/cmd_shard_mpi.c,$(CLI_SRC))
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)

TEST_SRC := $(wildcard tests/unit/test_*.c)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
ifeq ($(NO_NET),1)
# the record parsers of lib/sync, lib/shard and lib/dock are not in a core build
FUZZ_SRC := $(filter-out $(addprefix tests/fuzz/fuzz_,head.c manifest.c compactions.c batch.c cursor.c),$(FUZZ_SRC))
endif
REPLAY_BIN := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=$(BUILD)/tests/replay_%)
TOOL_SRC := $(wildcard tests/tools/*.c)
ifeq ($(NO_NET),1)
# sharded runs and the dock need the store: not in a core build
TEST_SRC := $(filter-out tests/unit/test_shard.c,$(TEST_SRC))
TOOL_SRC := $(filter-out tests/tools/mkdock.c tests/tools/shard_island.c,$(TOOL_SRC))
endif
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TOOL_BIN := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tools/%)
EXAMPLE_SRC := $(wildcard examples/*.c)
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
# examples/rl: the reference RL workload — module objects (not part of
# libferry) plus drivers examples/rl/rl_*.c, one program each.
RL_DRV_SRC := $(wildcard examples/rl/rl_*.c)
RL_SRC   := $(filter-out $(RL_DRV_SRC) examples/rl/loco_%.c,$(wildcard examples/rl/*.c))
RL_OBJ   := $(RL_SRC:%.c=$(BUILD)/%.o)
RL_BIN   := $(RL_DRV_SRC:examples/rl/%.c=$(BUILD)/examples/%)
# examples/rl/demo: build/ferry-demo, the decoupled RL run (docs/DEMO.md):
# the RL module plus the CLI's helpers and `ferry mirror` (its --mirror
# child) as objects.  It needs the store, so a core build has none.
DEMO_SRC := $(wildcard examples/rl/demo/*.c)
DEMO_OBJ := $(DEMO_SRC:%.c=$(BUILD)/%.o)
DEMO_CLI_OBJ := $(addprefix $(BUILD)/programs/ferry/,util.o cmd_sync.o cmd_mirror.o)
ifneq ($(NO_NET),1)
DEMO_BIN := $(BUILD)/ferry-demo
endif
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

STATIC := $(BUILD)/libferry.a
SHARED := $(BUILD)/libferry.so

# lib/loco (include/ferry_loco.h): not in libferry.  Its MPI-free part
# (gate, payload codec, outer step) builds with $(CC) and is what
# tests/unit/test_loco_codec links; build/libferry_loco.a adds the MPI
# exchange, compiled with mpicc (told to use $(CC)), and the MPI programs
# (examples/rl/loco_*.c) link with mpicc.  Without mpicc, or with NO_MPI=1,
# only the MPI-free part is built and the MPI tests skip.
LOCO_CORE_SRC := $(filter-out lib/loco/exchange.c,$(wildcard lib/loco/*.c))
LOCO_CORE_OBJ := $(LOCO_CORE_SRC:%.c=$(BUILD)/%.o)
ifeq ($(NO_MPI),1)
MPICC    :=
else ifeq ($(origin MPICC),undefined)
MPICC    := $(shell command -v mpicc 2>/dev/null)
endif
MPICC_CC := OMPI_CC="$(CC)" MPICH_CC="$(CC)" $(MPICC)
# Ranks must compute bit-identical updates, and a test compares them with
# its own arithmetic: no fused multiply-add contraction (clang's default
# "on" may fuse, gcc's -std=c11 default does not).
$(LOCO_CORE_OBJ) $(BUILD)/lib/loco/exchange.o: CFLAGS += -ffp-contract=off
$(BUILD)/tests/test_loco_codec: private CFLAGS += -ffp-contract=off
LOCO_LIB := $(BUILD)/libferry_loco.a
LOCO_BIN := $(patsubst examples/rl/%.c,$(BUILD)/examples/%,$(wildcard examples/rl/loco_*.c))
# tests/mpi/*.c: MPI test programs, run under mpirun by tests/scripts/loco_mpi.sh
# (not by tests/run.sh directly, hence outside $(BUILD)/tests/test_*).
LOCO_MPI_TEST := $(patsubst tests/mpi/%.c,$(BUILD)/tests/mpi/%,$(wildcard tests/mpi/*.c))
ifneq ($(MPICC),)
LOCO_ALL := $(LOCO_LIB) $(LOCO_BIN) $(LOCO_MPI_TEST)
endif
# Sharded publish over MPI (include/ferry_shard.h): ferry_shard_publish_mpi in
# build/libferry_shard_mpi.a and the publisher program build/ferry-shard-mpi,
# both built with mpicc like lib/loco's exchange; not in libferry.
SHARD_MPI_LIB := $(BUILD)/libferry_shard_mpi.a
ifneq ($(MPICC),)
ifneq ($(NO_NET),1)
SHARD_MPI_ALL := $(SHARD_MPI_LIB) $(BUILD)/ferry-shard-mpi
SHARD_MPI_TEST := $(BUILD)/tests/ferry-shard-mpi-hooks
endif
endif

.PHONY: all lib cli tests examples benches test bench fuzz install clean loco
all: lib cli tests examples loco
loco: $(LOCO_CORE_OBJ) $(LOCO_ALL)
all: $(SHARD_MPI_ALL) $(SHARD_MPI_TEST)

lib: $(STATIC) $(SHARED)
cli: $(BUILD)/ferry
tests: $(TEST_BIN) $(REPLAY_BIN) $(TOOL_BIN)
examples: $(EXAMPLE_BIN) $(RL_BIN) $(DEMO_BIN)
benches: $(BENCH_BIN)

$(BUILD)/%.o: %.c $(wildcard include/*.h lib/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(SHARED): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libferry.so.0 -o $@ $^ $(LDFLAGS) $(LIBS)

$(CLI_OBJ): $(wildcard programs/ferry/*.h)
$(BUILD)/ferry: $(CLI_OBJ) $(STATIC)
	$(CC) -o $@ $(CLI_OBJ) $(STATIC) $(LDFLAGS) $(LIBS)

# Unit tests may use internal headers (lib/*), so they link the static library.
$(BUILD)/tests/%: tests/unit/%.c tests/unit/check.h tests/unit/helpers.h tests/unit/sync_fixture.h $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/unit $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(STATIC) $(LDFLAGS) $(LIBS)

# Corpus replay: the libFuzzer entry point driven by a plain main().
$(BUILD)/tests/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(wildcard tests/fuzz/*.h) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-missing-prototypes -o $@ $< tests/fuzz/replay.c $(STATIC) $(LDFLAGS) $(LIBS)

$(BUILD)/tools/%: tests/tools/%.c $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(STATIC) $(LDFLAGS) $(LIBS)

# Examples and benches use only the public API (plus bench/*.h helpers).
$(BUILD)/examples/%: examples/%.c $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(STATIC) $(LDFLAGS) $(LIBS)

# The RL module and its users (programs and tests/unit/test_rl.c).
$(RL_OBJ): $(wildcard examples/rl/*.h)
$(BUILD)/examples/rl_%: examples/rl/rl_%.c $(RL_OBJ) $(STATIC) $(wildcard examples/rl/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Iexamples/rl $(CFLAGS) -o $@ $< $(RL_OBJ) $(STATIC) $(LDFLAGS) $(LIBS)

# -iquote: searched before -Ilib/common, so "util.h" is the CLI's
$(DEMO_OBJ): CPPFLAGS += -iquote examples/rl -iquote programs/ferry
$(DEMO_OBJ): $(wildcard examples/rl/*.h examples/rl/demo/*.h programs/ferry/*.h)
$(BUILD)/ferry-demo: $(DEMO_OBJ) $(DEMO_CLI_OBJ) $(RL_OBJ) $(STATIC)
	$(CC) -o $@ $(DEMO_OBJ) $(DEMO_CLI_OBJ) $(RL_OBJ) $(STATIC) $(LDFLAGS) $(LIBS)

$(BUILD)/tests/test_rl: tests/unit/test_rl.c tests/unit/check.h $(RL_OBJ) $(STATIC) $(wildcard examples/rl/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/unit -Iexamples/rl $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(RL_OBJ) $(STATIC) $(LDFLAGS) $(LIBS)

$(BUILD)/lib/loco/exchange.o: lib/loco/exchange.c $(wildcard include/*.h lib/*/*.h)
	@mkdir -p $(dir $@)
	$(MPICC_CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(LOCO_LIB): $(LOCO_CORE_OBJ) $(BUILD)/lib/loco/exchange.o
	rm -f $@ && ar rcs $@ $^

$(BUILD)/tests/test_loco_codec: tests/unit/test_loco_codec.c tests/unit/check.h $(LOCO_CORE_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/unit $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(LOCO_CORE_OBJ) $(STATIC) $(LDFLAGS) $(LIBS)

$(BUILD)/tests/mpi/%: tests/mpi/%.c $(LOCO_LIB) $(STATIC)
	@mkdir -p $(dir $@)
	$(MPICC_CC) $(CPPFLAGS) $(CFLAGS) -ffp-contract=off -Wno-missing-prototypes -o $@ $< $(LOCO_LIB) $(STATIC) $(LDFLAGS) $(LIBS)

$(BUILD)/examples/loco_%: examples/rl/loco_%.c $(RL_OBJ) $(LOCO_LIB) $(STATIC) $(wildcard examples/rl/*.h)
	@mkdir -p $(dir $@)
	$(MPICC_CC) $(CPPFLAGS) -Iexamples/rl $(CFLAGS) -o $@ $< $(RL_OBJ) $(LOCO_LIB) $(STATIC) $(LDFLAGS) $(LIBS)

$(BUILD)/lib/shard/shard_mpi.o: lib/shard/shard_mpi.c $(wildcard include/*.h lib/*/*.h)
	@mkdir -p $(dir $@)
	$(MPICC_CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(SHARD_MPI_LIB): $(BUILD)/lib/shard/shard_mpi.o
	rm -f $@ && ar rcs $@ $^

$(BUILD)/ferry-shard-mpi: programs/ferry/cmd_shard_mpi.c $(SHARD_MPI_LIB) $(BUILD)/programs/ferry/cmd_sync.o $(BUILD)/programs/ferry/util.o $(STATIC)
	$(MPICC_CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(BUILD)/programs/ferry/cmd_sync.o $(BUILD)/programs/ferry/util.o $(SHARD_MPI_LIB) $(STATIC) $(LDFLAGS) $(LIBS)

# Test hooks (-DFERRY_TEST_HOOKS) exist only in test programs, never in
# libferry or an installed program: tests/scripts/shard_mpi.sh kills a rank
# mid-publish with build/tests/ferry-shard-mpi-hooks, the publisher with
# lib/shard/shard_pub.c's stall and the program's pid files compiled in.
# Its own shard_pub.o comes before libferry.a, so the archive's is unused.
SHARD_HOOKS_OBJ := $(BUILD)/test-hooks/lib/shard/shard_pub.o
$(SHARD_HOOKS_OBJ): lib/shard/shard_pub.c $(wildcard include/*.h lib/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -DFERRY_TEST_HOOKS $(CFLAGS) -c $< -o $@
$(BUILD)/tests/ferry-shard-mpi-hooks: programs/ferry/cmd_shard_mpi.c $(SHARD_HOOKS_OBJ) $(SHARD_MPI_LIB) $(BUILD)/programs/ferry/cmd_sync.o $(BUILD)/programs/ferry/util.o $(STATIC)
	@mkdir -p $(dir $@)
	$(MPICC_CC) $(CPPFLAGS) -DFERRY_TEST_HOOKS $(CFLAGS) -o $@ $< $(BUILD)/programs/ferry/cmd_sync.o $(BUILD)/programs/ferry/util.o \
	  $(SHARD_HOOKS_OBJ) $(SHARD_MPI_LIB) $(STATIC) $(LDFLAGS) $(LIBS)

$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(STATIC) $(LDFLAGS) $(LIBS)

test: all
	@BUILD=$(BUILD) FERRY_DATA=$(FERRY_DATA) SAN=$(SAN) bash tests/run.sh

fuzz:
	$(MAKE) -f tests/fuzz/fuzz.mk

bench: all benches
	@BUILD=$(BUILD) FERRY_DATA=$(FERRY_DATA) bash bench/run.sh

# ferry-demo is an example (examples/rl/demo) and is not installed.
install: lib cli $(SHARD_MPI_ALL)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/libferry.so.0
	ln -sf libferry.so.0 $(DESTDIR)$(PREFIX)/lib/libferry.so
	install -m 644 include/*.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(BUILD)/ferry $(if $(SHARD_MPI_ALL),$(BUILD)/ferry-shard-mpi) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBS@|$(LIBS)|' -e 's|@VERSION@|$(shell sed -n 's/.*FERRY_VERSION_STRING "\(.*\)"/\1/p' include/ferry.h)|' \
	  libferry.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/libferry.pc

clean:
	rm -rf build build-san
