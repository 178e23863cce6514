# nvshare: the user's entry points.
#
#   make run            build and run the main job (on a GPU if there is one, else on the simulated GPU)
#   make test           install what is missing, build, and run every test suite
#   make fuzz SECONDS=N run each libFuzzer target for N seconds (default 60)
#   make soak MINUTES=N the long chaos run: restarts, hogs, floods, churn (default 10 minutes; root)
#   make test-sanitize  build everything with ASan and UBSan (build-sanitize/) and run every suite
#   make format         clang-format the tree
#
# Both `run` and `test` install missing Debian build packages first (see scripts/install-deps.sh).
BUILD ?= build
SANITIZE_BUILD ?= build-sanitize
SECONDS ?= 60
MINUTES ?= 10
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
# For test-sanitize: any report stops the process (and fails its test); leaks are reported.
SANITIZE_ASAN_OPTIONS ?= abort_on_error=0:detect_leaks=1:halt_on_error=1

.PHONY: all deps-build deps-test configure build test test-sanitize run fuzz soak format clean

all: build

deps-build:
	@scripts/install-deps.sh build

deps-test:
	@scripts/install-deps.sh test

# Configure once per build directory. clang builds everything when present (the fuzz targets need it),
# g++ otherwise; the check runs after the dependencies are installed.
$(BUILD)/build.ninja:
	@cmake -S . -B $(BUILD) -G Ninja \
	  $(if $(shell command -v clang++ 2>/dev/null),-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++) \
	  -DNVSHARE_WITH_K8S=ON $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: deps-test configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

run: build
	@scripts/run-demo.sh $(BUILD)

fuzz: build
	@scripts/fuzz.sh $(BUILD) $(SECONDS)

soak: build
	@NVSHARE_SOAK_MINUTES=$(MINUTES) $(BUILD)/tests/chaos/soak_test

# Everything again with AddressSanitizer and UndefinedBehaviorSanitizer (clang), the client library
# and the simulated driver included; any report fails the test it happens in.
$(SANITIZE_BUILD)/build.ninja:
	@cmake -S . -B $(SANITIZE_BUILD) -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DNVSHARE_WITH_K8S=ON -DNVSHARE_SANITIZE=address,undefined $(CMAKE_FLAGS)

test-sanitize: deps-test $(SANITIZE_BUILD)/build.ninja
	@cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	@cd $(SANITIZE_BUILD) && ASAN_OPTIONS=$(SANITIZE_ASAN_OPTIONS) \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

format:
	@find src tests bench -name '*.cc' -o -name '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) $(SANITIZE_BUILD)
