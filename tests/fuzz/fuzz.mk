# libFuzzer targets: build-fuzz/fuzz_<name> for every tests/fuzz/fuzz_<name>.c
# (run from the repository root: `make fuzz`, or `make -f tests/fuzz/fuzz.mk`).
#
# The library (core and network layers: the record parsers of lib/sync and
# lib/dock are fuzzed too) is compiled with clang and
# coverage-instrumented (-fsanitize=fuzzer-no-link) so libFuzzer sees its
# branches; address and undefined-behaviour sanitizers abort on the first
# finding.  Then, for example:
#   ./build-fuzz/fuzz_safetensors -max_total_time=600 -max_len=4096 tests/fuzz/corpus/safetensors
# Without libFuzzer, `make test` replays the corpus (build/tests/replay_*).
FUZZ_CC    ?= clang
FUZZ_BUILD ?= build-fuzz
SAN_FLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=undefined
CPPFLAGS   := -Iinclude -Ilib -Ilib/common -D_GNU_SOURCE
CFLAGS     := -std=c11 -O1 -g -fno-omit-frame-pointer -pthread -Wall -Wextra -Wno-missing-field-initializers
LIBS       := -lzstd -lxxhash -ljansson -lm -lcurl -lcrypto

LIB_SRC := $(filter-out lib/shard/shard_mpi.c,$(wildcard lib/common/*.c lib/codec/*.c lib/io/*.c lib/store/*.c lib/sign/*.c \
                                                         lib/sync/*.c lib/shard/*.c lib/mirror/*.c lib/dock/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_BUILD)/%.o)
TARGETS := $(patsubst tests/fuzz/fuzz_%.c,$(FUZZ_BUILD)/fuzz_%,$(wildcard tests/fuzz/fuzz_*.c))

.PHONY: all
.SECONDARY: $(LIB_OBJ)
all: $(TARGETS)

$(FUZZ_BUILD)/%.o: %.c $(wildcard include/*.h lib/*/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) $(CFLAGS) $(SAN_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

# (tests/tools/*.h: golden_model.h, fuzz_patch's base)
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(LIB_OBJ) $(wildcard tests/tools/*.h tests/fuzz/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) $(CFLAGS) $(SAN_FLAGS) -fsanitize=fuzzer -o $@ $< $(LIB_OBJ) $(LIBS)
