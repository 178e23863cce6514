# Warning flags applied to every first-party target through nvshare_warnings().
add_library(nvshare_warnings INTERFACE)
target_compile_options(nvshare_warnings INTERFACE -Wall -Wextra -Wshadow -Wnon-virtual-dtor
                       -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual -Wformat=2)
if(NVSHARE_WERROR)
  target_compile_options(nvshare_warnings INTERFACE -Werror)
endif()
