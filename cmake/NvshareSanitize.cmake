# NVSHARE_SANITIZE: build every first-party target, the client library and the simulated driver
# included, with these sanitizers ("address,undefined" for `make test-sanitize`). Empty: none.
#
# Shared libraries built this way (libnvshare.so, the simulated libcuda.so.1 and
# libnvidia-ml.so.1) take the sanitizer runtime from the executable they are loaded into, as every
# test program here is built with it too; so their "no undefined symbols" link check is off in
# such a build. A failed check stops the process (-fno-sanitize-recover), so a test fails on the
# first report.
set(NVSHARE_SANITIZE "" CACHE STRING "Sanitizers for every target (e.g. address,undefined); empty: none")
if(NVSHARE_SANITIZE)
  message(STATUS "nvshare: sanitizers ${NVSHARE_SANITIZE}")
  add_compile_options(-fsanitize=${NVSHARE_SANITIZE} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${NVSHARE_SANITIZE})
endif()

# The link option that refuses undefined symbols in a shared library, unless sanitizers are on.
function(nvshare_no_undefined target)
  if(NOT NVSHARE_SANITIZE)
    target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  endif()
endfunction()
