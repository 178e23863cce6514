# Cross-compiles for 64-bit Arm Linux with Debian's cross toolchain against an arm64 sysroot that
# holds the Kubernetes components' libraries (tests/compat/make_arm64_sysroot.sh makes one):
#   NVSHARE_AARCH64_SYSROOT=/path/to/root cmake -S . -B build-aarch64 -DNVSHARE_WITH_K8S=ON \
#     -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu-sysroot.cmake
# Programs (protoc, grpc_cpp_plugin) are the host's: they must be the versions of the sysroot's
# libraries (the same Debian release).
if(NOT DEFINED ENV{NVSHARE_AARCH64_SYSROOT})
  message(FATAL_ERROR "set NVSHARE_AARCH64_SYSROOT to an arm64 root (tests/compat/make_arm64_sysroot.sh)")
endif()
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_SYSROOT $ENV{NVSHARE_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH $ENV{NVSHARE_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config (re2, grpc++ without CMake files) reads the sysroot's .pc files.
set(ENV{PKG_CONFIG_SYSROOT_DIR} $ENV{NVSHARE_AARCH64_SYSROOT})
set(ENV{PKG_CONFIG_LIBDIR}
    "$ENV{NVSHARE_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:$ENV{NVSHARE_AARCH64_SYSROOT}/usr/share/pkgconfig")
