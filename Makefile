# Thin wrapper over CMake so that the README's two commands stay short.
#   make bench   build, then print the benchmark table (GPU if present, else CPU)
#   make test    build, then run every test (GPU tests skip cleanly without a GPU)
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build bench test clean

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

bench: build
	$(BUILD)/bench/fnbench

test: build
	$(BUILD)/tests/fnorm_tests

clean:
	rm -rf $(BUILD)
