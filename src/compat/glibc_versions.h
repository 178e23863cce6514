// The glibc symbol versions the floor (glibc_floor.c, glibc_floor_start.c) binds to: for each
// architecture, the version that introduced each name there.
#pragma once

#if defined(__x86_64__)
#define FLOOR_BASE "GLIBC_2.2.5"
#define FLOOR_2_12 "GLIBC_2.12"   // pthread_setname_np, robust mutexes
#define FLOOR_COND "GLIBC_2.3.2"  // the condition variables of NPTL
#define FLOOR_C99_SCANF "GLIBC_2.7"
#elif defined(__aarch64__)
// Every name the floor uses is in glibc 2.17, aarch64's first.
#define FLOOR_BASE "GLIBC_2.17"
#define FLOOR_2_12 "GLIBC_2.17"
#define FLOOR_COND "GLIBC_2.17"
#define FLOOR_C99_SCANF "GLIBC_2.17"
#else
#error "the glibc floor knows x86_64 and aarch64"
#endif
