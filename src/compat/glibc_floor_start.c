// The glibc floor for executables: the program's start-up, the old way.
//
// glibc 2.34 changed how a program starts: crt1.o passes no constructor runner and calls
// __libc_start_main@GLIBC_2.34, which runs the program's constructors itself. An older glibc has no
// such version. This file defines __libc_start_main, hidden, so crt1.o's call binds here, and calls
// the architecture's first version with a runner for the program's _init and .init_array, as the
// crt1.o of older glibcs did (__libc_csu_init). Destructors are unchanged: the loader runs
// .fini_array at exit under every version.
//
// Link it into executables only (src/compat/CMakeLists.txt: nvshare_glibc_floor(TARGET)).
#define _GNU_SOURCE 1
#include <stddef.h>

#include "glibc_versions.h"

typedef int (*floor_main_fn)(int, char**, char**);
typedef void (*floor_init_fn)(int, char**, char**);

int floor_libc_start_main(floor_main_fn main, int argc, char** argv, floor_init_fn init,
                          void (*fini)(void), void (*rtld_fini)(void), void* stack_end);
__asm__(".symver floor_libc_start_main,__libc_start_main@" FLOOR_BASE);

extern void _init(void);
extern floor_init_fn __init_array_start[] __attribute__((visibility("hidden")));
extern floor_init_fn __init_array_end[] __attribute__((visibility("hidden")));

static void floor_run_constructors(int argc, char** argv, char** envp) {
  _init();
  const size_t count = (size_t)(__init_array_end - __init_array_start);
  for (size_t i = 0; i < count; ++i) __init_array_start[i](argc, argv, envp);
}

__attribute__((visibility("hidden"))) int __libc_start_main(floor_main_fn main, int argc,
                                                            char** argv, floor_init_fn init,
                                                            void (*fini)(void),
                                                            void (*rtld_fini)(void),
                                                            void* stack_end) {
  (void)init;
  (void)fini;
  return floor_libc_start_main(main, argc, argv, floor_run_constructors, NULL, rtld_fini,
                               stack_end);
}
