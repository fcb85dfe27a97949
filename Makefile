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

PYTHON ?= python3

# The C tests (and, in CUDA builds, the host-side checks of the CUDA plans), then the Python
# package's tests (through the CPU backend, and the GPU when
# torch sees one) when numpy and pytest are installed.
test: build
	$(BUILD)/tests/fnorm_tests
	@if [ -x $(BUILD)/tests/fnorm_plan_tests ]; then $(BUILD)/tests/fnorm_plan_tests; \
	else echo "CUDA plan tests skipped: built without CUDA"; fi
	@if $(PYTHON) -c "import numpy, pytest" 2>/dev/null; then \
	  FUSEDNORM_LIBRARY=$(abspath $(BUILD))/libfusednorm.so PYTHONPATH=python \
	    $(PYTHON) -m pytest -q python/tests; \
	else \
	  echo "Python tests skipped: numpy and pytest are not installed (pip install numpy pytest)"; \
	fi

clean:
	rm -rf $(BUILD)
