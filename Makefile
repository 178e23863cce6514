# nvshare: the user's entry points.
#
#   make run            build and run the main job (on a GPU if there is one, else on the simulated GPU)
#   make test           install what is missing, build, and run every test suite
#   make fuzz SECONDS=N run each libFuzzer target for N seconds (default 60)
#   make soak MINUTES=N the long chaos run: restarts, hogs, floods, churn (default 10 minutes; root)
#   make test-sanitize  build everything with ASan and UBSan (build-sanitize/) and run every suite
#   make image          build the node image (deploy/docker/Dockerfile) with podman or docker; makes
#                       its base images locally when no registry answers (scripts/build-image.sh)
#   make format         clang-format the tree
#
# Both install what is missing first (scripts/install-deps.sh): `run` only CMake, Ninja, a compiler,
# make and python3 (tools already on PATH count, wherever they came from), `test` all the rest.
BUILD ?= build
SANITIZE_BUILD ?= build-sanitize
SECONDS ?= 60
MINUTES ?= 10
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
# For test-sanitize: any report stops the process (and fails its test); leaks are reported.
SANITIZE_ASAN_OPTIONS ?= abort_on_error=0:detect_leaks=1:halt_on_error=1

.PHONY: all deps-build deps-run deps-test configure build build-run test test-sanitize run fuzz soak \
	image format clean

all: build

deps-build:
	@scripts/install-deps.sh build

deps-run:
	@scripts/install-deps.sh run

deps-test:
	@scripts/install-deps.sh test

# The test build: everything, the Kubernetes components and the tests included. clang builds it when
# present (the fuzz targets need it), the system's compiler otherwise; the check runs after the
# dependencies are installed. Run again each time, so a directory first configured by `make run` gains
# the tests (a configured directory takes a few seconds).
configure:
	@cmake -S . -B $(BUILD) -G Ninja \
	  $(if $(shell command -v clang++ 2>/dev/null),-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++) \
	  -DNVSHARE_WITH_K8S=ON -DNVSHARE_BUILD_TESTS=ON $(CMAKE_FLAGS) >/dev/null

build: deps-test configure
	@cmake --build $(BUILD) -j $(JOBS)

# The main job needs neither the tests nor the Kubernetes components: a directory configured here
# builds only the library, the scheduler, nvsharectl, nvshare-run and the trainer; one already
# configured (by `make test`) is used as it is.
RUN_TARGETS = nvshare nvshare-scheduler nvsharectl nvshare-run nvshare-trainer
build-run: deps-run
	@if [ ! -f $(BUILD)/build.ninja ]; then \
	  cmake -S . -B $(BUILD) -G Ninja -DNVSHARE_WITH_K8S=OFF -DNVSHARE_BUILD_TESTS=OFF $(CMAKE_FLAGS) \
	    >/dev/null; fi
	@cmake --build $(BUILD) -j $(JOBS) --target $(RUN_TARGETS) fakecuda fakenvml || { \
	  echo "run: the build failed. The library, the simulated GPU and the trainer compile against" \
	    "cuda.h of CUDA 12 or later (they link nothing from it), which Debian's archive does not" \
	    "carry: install NVIDIA's CUDA toolkit (from NVIDIA's apt repository, the package" \
	    "cuda-driver-dev-12-<minor> holds cuda.h alone), or point CUDA_HOME at a toolkit, then" \
	    "run 'make clean run'" >&2; exit 1; }

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

run: build-run
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

image:
	@scripts/build-image.sh $(TAG)

format:
	@find src tests bench -name '*.cc' -o -name '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) $(SANITIZE_BUILD)
