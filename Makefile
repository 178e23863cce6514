# nvshare: the user's entry points.
#
#   make run            build and run the main job (on a GPU if there is one, else on the simulated GPU)
#   make test           install what is missing, build, and run every test suite
#   make fuzz SECONDS=N run each libFuzzer target for N seconds (default 60)
#   make format         clang-format the tree
#
# Both `run` and `test` install missing Debian build packages first (see scripts/install-deps.sh).
BUILD ?= build
SECONDS ?= 60
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps-build deps-test configure build test run fuzz format clean

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

format:
	@find src tests bench -name '*.cc' -o -name '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD)
