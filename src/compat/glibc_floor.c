// The glibc floor: what lets a library built against a new glibc load under an old one.
//
// A program or library linked on a glibc 2.34+ system asks for the newest version of every libc
// function it calls (pthread_create@GLIBC_2.34, stat@GLIBC_2.33, ...), and the static libstdc++ and
// libgcc of a new GCC add functions older libcs lack (arc4random, _dl_find_object); glibc 2.38's
// headers turn sscanf and strtoul into C23 variants (__isoc23_sscanf@GLIBC_2.38). The loader of an
// older glibc then refuses the whole object. This file defines each such function, hidden, so that
// every reference in the link (ours and the static runtime's) binds here, and forwards to the
// version every supported glibc has: the architecture's first version (GLIBC_2.2.5 on x86_64,
// GLIBC_2.17 on aarch64; GLIBC_2.12 for pthread_setname_np on x86_64, when it appeared) or a system
// call. The floor is glibc 2.17 on aarch64 and 2.12 on x86_64 for these names; the library's
// highest version is checked by tests/compat (at most GLIBC_2.28).
//
// Contract
//  - Hidden: none of these names is exported; the process's own calls reach glibc as before.
//  - Same behaviour as glibc's functions, with two documented differences: pthread_cond_clockwait
//    waits on CLOCK_REALTIME (the condition variables libstdc++ makes use it), converting the
//    deadline; _dl_find_object fills the fields an unwinder reads (map bounds, eh_frame), not
//    dlfo_link_map.
//  - The libraries the old versions live in (libpthread.so.0, libdl.so.2 before glibc 2.34) are
//    named as DT_NEEDED by the link options in src/compat/CMakeLists.txt.
#define _GNU_SOURCE 1
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "glibc_versions.h"

#define FLOOR_HIDDEN __attribute__((visibility("hidden")))
// `local` is a reference to `name@version` in this object.
#define FLOOR_OLD(local, name, version) __asm__(".symver " #local "," #name "@" version)

// ---- threads ---------------------------------------------------------------------------------

int floor_pthread_create(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
int floor_pthread_join(pthread_t, void**);
int floor_pthread_once(pthread_once_t*, void (*)(void));
int floor_pthread_key_create(pthread_key_t*, void (*)(void*));
int floor_pthread_key_delete(pthread_key_t);
void* floor_pthread_getspecific(pthread_key_t);
int floor_pthread_setspecific(pthread_key_t, const void*);
int floor_pthread_setname_np(pthread_t, const char*);
int floor_pthread_cond_timedwait(pthread_cond_t*, pthread_mutex_t*, const struct timespec*);
int floor_pthread_detach(pthread_t);
int floor_pthread_mutexattr_init(pthread_mutexattr_t*);
int floor_pthread_mutexattr_destroy(pthread_mutexattr_t*);
int floor_pthread_mutexattr_setpshared(pthread_mutexattr_t*, int);
int floor_pthread_mutexattr_setrobust(pthread_mutexattr_t*, int);
int floor_pthread_mutex_consistent(pthread_mutex_t*);
// In libpthread only before glibc 2.34 (std::unique_lock's try_to_lock reaches it).
int floor_pthread_mutex_trylock(pthread_mutex_t*);
// Read-write locks: libstdc++'s memory resources (std::from_chars of a double reaches them).
int floor_pthread_rwlock_rdlock(pthread_rwlock_t*);
int floor_pthread_rwlock_wrlock(pthread_rwlock_t*);
int floor_pthread_rwlock_unlock(pthread_rwlock_t*);
FLOOR_OLD(floor_pthread_create, pthread_create, FLOOR_BASE);
FLOOR_OLD(floor_pthread_join, pthread_join, FLOOR_BASE);
FLOOR_OLD(floor_pthread_once, pthread_once, FLOOR_BASE);
FLOOR_OLD(floor_pthread_key_create, pthread_key_create, FLOOR_BASE);
FLOOR_OLD(floor_pthread_key_delete, pthread_key_delete, FLOOR_BASE);
FLOOR_OLD(floor_pthread_getspecific, pthread_getspecific, FLOOR_BASE);
FLOOR_OLD(floor_pthread_setspecific, pthread_setspecific, FLOOR_BASE);
FLOOR_OLD(floor_pthread_setname_np, pthread_setname_np, FLOOR_2_12);
FLOOR_OLD(floor_pthread_cond_timedwait, pthread_cond_timedwait, FLOOR_COND);
FLOOR_OLD(floor_pthread_detach, pthread_detach, FLOOR_BASE);
FLOOR_OLD(floor_pthread_mutexattr_init, pthread_mutexattr_init, FLOOR_BASE);
FLOOR_OLD(floor_pthread_mutexattr_destroy, pthread_mutexattr_destroy, FLOOR_BASE);
FLOOR_OLD(floor_pthread_mutexattr_setpshared, pthread_mutexattr_setpshared, FLOOR_BASE);
FLOOR_OLD(floor_pthread_mutexattr_setrobust, pthread_mutexattr_setrobust, FLOOR_2_12);
FLOOR_OLD(floor_pthread_mutex_consistent, pthread_mutex_consistent, FLOOR_2_12);
FLOOR_OLD(floor_pthread_mutex_trylock, pthread_mutex_trylock, FLOOR_BASE);
FLOOR_OLD(floor_pthread_rwlock_rdlock, pthread_rwlock_rdlock, FLOOR_BASE);
FLOOR_OLD(floor_pthread_rwlock_wrlock, pthread_rwlock_wrlock, FLOOR_BASE);
FLOOR_OLD(floor_pthread_rwlock_unlock, pthread_rwlock_unlock, FLOOR_BASE);

FLOOR_HIDDEN int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                void* (*start)(void*), void* arg) {
  return floor_pthread_create(thread, attr, start, arg);
}
FLOOR_HIDDEN int pthread_join(pthread_t thread, void** result) {
  return floor_pthread_join(thread, result);
}
FLOOR_HIDDEN int pthread_once(pthread_once_t* once, void (*init)(void)) {
  return floor_pthread_once(once, init);
}
FLOOR_HIDDEN int pthread_key_create(pthread_key_t* key, void (*destructor)(void*)) {
  return floor_pthread_key_create(key, destructor);
}
// libstdc++ tests this weak name to learn whether threads are in use; defined, it says yes.
FLOOR_HIDDEN int __pthread_key_create(pthread_key_t* key, void (*destructor)(void*)) {
  return floor_pthread_key_create(key, destructor);
}
FLOOR_HIDDEN int pthread_key_delete(pthread_key_t key) { return floor_pthread_key_delete(key); }
FLOOR_HIDDEN void* pthread_getspecific(pthread_key_t key) { return floor_pthread_getspecific(key); }
FLOOR_HIDDEN int pthread_setspecific(pthread_key_t key, const void* value) {
  return floor_pthread_setspecific(key, value);
}
FLOOR_HIDDEN int pthread_setname_np(pthread_t thread, const char* name) {
  return floor_pthread_setname_np(thread, name);
}
FLOOR_HIDDEN int pthread_detach(pthread_t thread) { return floor_pthread_detach(thread); }
FLOOR_HIDDEN int pthread_mutexattr_init(pthread_mutexattr_t* attr) {
  return floor_pthread_mutexattr_init(attr);
}
FLOOR_HIDDEN int pthread_mutexattr_destroy(pthread_mutexattr_t* attr) {
  return floor_pthread_mutexattr_destroy(attr);
}
FLOOR_HIDDEN int pthread_mutexattr_setpshared(pthread_mutexattr_t* attr, int shared) {
  return floor_pthread_mutexattr_setpshared(attr, shared);
}
FLOOR_HIDDEN int pthread_mutexattr_setrobust(pthread_mutexattr_t* attr, int robust) {
  return floor_pthread_mutexattr_setrobust(attr, robust);
}
FLOOR_HIDDEN int pthread_mutex_consistent(pthread_mutex_t* mutex) {
  return floor_pthread_mutex_consistent(mutex);
}
FLOOR_HIDDEN int pthread_mutex_trylock(pthread_mutex_t* mutex) {
  return floor_pthread_mutex_trylock(mutex);
}
FLOOR_HIDDEN int pthread_rwlock_rdlock(pthread_rwlock_t* lock) {
  return floor_pthread_rwlock_rdlock(lock);
}
FLOOR_HIDDEN int pthread_rwlock_wrlock(pthread_rwlock_t* lock) {
  return floor_pthread_rwlock_wrlock(lock);
}
FLOOR_HIDDEN int pthread_rwlock_unlock(pthread_rwlock_t* lock) {
  return floor_pthread_rwlock_unlock(lock);
}
// sigprocmask, not the raw system call: glibc keeps its own signals (cancellation, setxid) open.
FLOOR_HIDDEN int pthread_sigmask(int how, const sigset_t* set, sigset_t* old) {
  return sigprocmask(how, set, old) == 0 ? 0 : errno;
}

static int64_t floor_ns(const struct timespec* t) {
  return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

// The deadline on `clock` moved onto CLOCK_REALTIME, the clock of a default condition variable.
FLOOR_HIDDEN int pthread_cond_clockwait(pthread_cond_t* cond, pthread_mutex_t* mutex,
                                        clockid_t clock, const struct timespec* deadline) {
  if (deadline->tv_nsec < 0 || deadline->tv_nsec >= 1000000000) return EINVAL;
  struct timespec now_clock;
  struct timespec now_real;
  if (clock_gettime(clock, &now_clock) != 0) return EINVAL;
  clock_gettime(CLOCK_REALTIME, &now_real);
  int64_t left = floor_ns(deadline) - floor_ns(&now_clock);
  if (left < 0) left = 0;
  const int64_t at = floor_ns(&now_real) + left;
  const struct timespec real_deadline = {.tv_sec = at / 1000000000, .tv_nsec = at % 1000000000};
  return floor_pthread_cond_timedwait(cond, mutex, &real_deadline);
}

// libstdc++ skips atomic reference counts when this says the process has one thread; zero keeps
// them atomic, always correct.
FLOOR_HIDDEN char __libc_single_threaded = 0;

// ---- the dynamic loader ----------------------------------------------------------------------

void* floor_dlopen(const char*, int);
char* floor_dlerror(void);
void* floor_dlvsym(void*, const char*, const char*);
FLOOR_OLD(floor_dlopen, dlopen, FLOOR_BASE);
FLOOR_OLD(floor_dlerror, dlerror, FLOOR_BASE);
FLOOR_OLD(floor_dlvsym, dlvsym, FLOOR_BASE);

FLOOR_HIDDEN void* dlopen(const char* file, int mode) { return floor_dlopen(file, mode); }
FLOOR_HIDDEN char* dlerror(void) { return floor_dlerror(); }
FLOOR_HIDDEN void* dlvsym(void* handle, const char* name, const char* version) {
  return floor_dlvsym(handle, name, version);
}

#ifdef DLFO_STRUCT_HAS_EH_DBASE
struct floor_find {
  uintptr_t pc;
  struct dl_find_object* out;
  int found;
};

static int floor_find_in(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  struct floor_find* find = data;
  uintptr_t low = UINTPTR_MAX;
  uintptr_t high = 0;
  int contains = 0;
  const void* eh_frame = NULL;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD) {
      if (start < low) low = start;
      if (start + ph->p_memsz > high) high = start + ph->p_memsz;
      if (find->pc >= start && find->pc < start + ph->p_memsz) contains = 1;
    } else if (ph->p_type == PT_GNU_EH_FRAME) {
      eh_frame = (const void*)start;
    }
  }
  if (!contains) return 0;
  memset(find->out, 0, sizeof *find->out);
  find->out->dlfo_map_start = (void*)low;
  find->out->dlfo_map_end = (void*)high;
  find->out->dlfo_eh_frame = (void*)eh_frame;
  find->found = 1;
  return 1;
}

FLOOR_HIDDEN int _dl_find_object(void* pc, struct dl_find_object* result) {
  struct floor_find find = {.pc = (uintptr_t)pc, .out = result, .found = 0};
  dl_iterate_phdr(floor_find_in, &find);
  return find.found ? 0 : -1;
}
#endif

// ---- files -----------------------------------------------------------------------------------

FLOOR_HIDDEN int fstat(int fd, struct stat* st) { return (int)syscall(SYS_fstat, fd, st); }
FLOOR_HIDDEN int stat(const char* path, struct stat* st) {
  return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
}
FLOOR_HIDDEN int lstat(const char* path, struct stat* st) {
  return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}

// ---- C23 number parsing -----------------------------------------------------------------------

// glibc 2.38's headers send strtol and the scanf family to C23 variants (__isoc23_*, which also
// read 0b binary literals) when compiling with GNU extensions, as C++ does. The variants forward to
// the C99 functions every glibc has; no caller here writes binary literals.
long floor_strtol(const char*, char**, int);
unsigned long floor_strtoul(const char*, char**, int);
long long floor_strtoll(const char*, char**, int);
unsigned long long floor_strtoull(const char*, char**, int);
int floor_vsscanf(const char*, const char*, va_list);
FLOOR_OLD(floor_strtol, strtol, FLOOR_BASE);
FLOOR_OLD(floor_strtoul, strtoul, FLOOR_BASE);
FLOOR_OLD(floor_strtoll, strtoll, FLOOR_BASE);
FLOOR_OLD(floor_strtoull, strtoull, FLOOR_BASE);
FLOOR_OLD(floor_vsscanf, __isoc99_vsscanf, FLOOR_C99_SCANF);

FLOOR_HIDDEN long __isoc23_strtol(const char* text, char** end, int base) {
  return floor_strtol(text, end, base);
}
FLOOR_HIDDEN unsigned long __isoc23_strtoul(const char* text, char** end, int base) {
  return floor_strtoul(text, end, base);
}
FLOOR_HIDDEN long long __isoc23_strtoll(const char* text, char** end, int base) {
  return floor_strtoll(text, end, base);
}
FLOOR_HIDDEN unsigned long long __isoc23_strtoull(const char* text, char** end, int base) {
  return floor_strtoull(text, end, base);
}
FLOOR_HIDDEN int __isoc23_vsscanf(const char* text, const char* format, va_list args) {
  return floor_vsscanf(text, format, args);
}
FLOOR_HIDDEN int __isoc23_sscanf(const char* text, const char* format, ...) {
  va_list args;
  va_start(args, format);
  const int result = floor_vsscanf(text, format, args);
  va_end(args);
  return result;
}

// ---- randomness ------------------------------------------------------------------------------

// getentropy (glibc 2.25) asks the kernel; /dev/urandom where it cannot; the clock mixed with the
// address space as a last resort rather than failing, since arc4random cannot report an error.
FLOOR_HIDDEN uint32_t arc4random(void) {
  uint32_t value = 0;
  if (getentropy(&value, sizeof value) == 0) return value;
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t got = read(fd, &value, sizeof value);
    close(fd);
    if (got == (ssize_t)sizeof value) return value;
  }
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  uint64_t mixed = (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 32) ^ (uintptr_t)&value;
  mixed ^= mixed >> 33;
  mixed *= 0xff51afd7ed558ccdULL;
  mixed ^= mixed >> 33;
  return (uint32_t)mixed;
}
