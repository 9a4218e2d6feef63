// Fault injection for the save tests, loaded with LD_PRELOAD into `seqpack`.
//
// Counts the file-system calls that change something under SEQPACK_FAULT_DIR
// (creating or opening a file for writing, write, pwrite, ftruncate, fsync,
// fdatasync, rename, renameat, renameat2, mkdir, unlink, unlinkat, rmdir,
// mkstemp) and makes the SEQPACK_FAULT_AT-th one (1-based) fail:
//   SEQPACK_FAULT_MODE=kill    the process gets SIGKILL instead of the call (a
//                              write first writes half its bytes: a torn write)
//   SEQPACK_FAULT_MODE=enospc  the call fails with ENOSPC (a full disk)
//   SEQPACK_FAULT_MODE=eio     the call fails with EIO
// With SEQPACK_FAULT_NO_EXCHANGE=1, renameat2(RENAME_EXCHANGE) fails with
// EINVAL, as on a file system without it.
// Every counted call is appended to SEQPACK_FAULT_LOG as "N call path" (the
// tests count the calls of a run with it, then fault each one in turn).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static atomic_long calls;

static const char* env(const char* name) {
  const char* v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

static int under_fault_dir(const char* path) {
  const char* dir = env("SEQPACK_FAULT_DIR");
  if (dir == NULL || path == NULL) return 0;
  char abs[8192];
  if (path[0] == '/') {
    snprintf(abs, sizeof abs, "%s", path);
  } else {
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd) == NULL) return 0;
    snprintf(abs, sizeof abs, "%s/%s", cwd, path);
  }
  const size_t n = strlen(dir);
  return strncmp(abs, dir, n) == 0 && (abs[n] == '/' || abs[n] == '\0');
}

static int fd_under_fault_dir(int fd, char* path, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, size - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return under_fault_dir(path);
}

static void log_call(long n, const char* call, const char* path) {
  const char* log = env("SEQPACK_FAULT_LOG");
  if (log == NULL) return;
  static ssize_t (*real_write)(int, const void*, size_t);
  if (real_write == NULL) real_write = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  const int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char line[8400];
  const int len = snprintf(line, sizeof line, "%ld %s %s\n", n, call, path);
  if (len > 0) real_write(fd, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
  close(fd);
}

// 0: go on with the call; -1: fail it (errno set). Kills the process in kill mode.
static int fault(const char* call, const char* path) {
  const long n = atomic_fetch_add(&calls, 1) + 1;
  log_call(n, call, path);
  const char* at = env("SEQPACK_FAULT_AT");
  if (at == NULL || atol(at) != n) return 0;
  const char* mode = env("SEQPACK_FAULT_MODE");
  if (mode == NULL || strcmp(mode, "kill") == 0) {
    kill(getpid(), SIGKILL);
    pause();
  }
  errno = strcmp(mode, "eio") == 0 ? EIO : ENOSPC;
  return -1;
}

#define REAL(name)                   \
  static __typeof__(&name) real_##name; \
  if (real_##name == NULL) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

static int writes(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0; }

int open(const char* path, int flags, ...) {
  REAL(open);
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  if (writes(flags) && under_fault_dir(path) && fault("open", path) != 0) return -1;
  return real_open(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  REAL(open64);
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  if (writes(flags) && under_fault_dir(path) && fault("open", path) != 0) return -1;
  return real_open64(path, flags, mode);
}

int mkstemp(char* tmpl) {
  REAL(mkstemp);
  if (under_fault_dir(tmpl) && fault("mkstemp", tmpl) != 0) return -1;
  return real_mkstemp(tmpl);
}

ssize_t write(int fd, const void* buf, size_t count) {
  REAL(write);
  char path[4096];
  if (fd > 2 && fd_under_fault_dir(fd, path, sizeof path)) {
    const long n = atomic_load(&calls) + 1;
    const char* at = env("SEQPACK_FAULT_AT");
    const char* mode = env("SEQPACK_FAULT_MODE");
    if (at != NULL && atol(at) == n && (mode == NULL || strcmp(mode, "kill") == 0) && count > 1) {
      real_write(fd, buf, count / 2);  // torn: half of it reaches the file
    }
    if (fault("write", path) != 0) return -1;
  }
  return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  REAL(pwrite);
  char path[4096];
  if (fd_under_fault_dir(fd, path, sizeof path) && fault("pwrite", path) != 0) return -1;
  return real_pwrite(fd, buf, count, offset);
}

int ftruncate(int fd, off_t length) {
  REAL(ftruncate);
  char path[4096];
  if (fd_under_fault_dir(fd, path, sizeof path) && fault("ftruncate", path) != 0) return -1;
  return real_ftruncate(fd, length);
}

int fsync(int fd) {
  REAL(fsync);
  char path[4096];
  if (fd_under_fault_dir(fd, path, sizeof path) && fault("fsync", path) != 0) return -1;
  return real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(fdatasync);
  char path[4096];
  if (fd_under_fault_dir(fd, path, sizeof path) && fault("fdatasync", path) != 0) return -1;
  return real_fdatasync(fd);
}

int rename(const char* from, const char* to) {
  REAL(rename);
  if ((under_fault_dir(from) || under_fault_dir(to)) && fault("rename", to) != 0) return -1;
  return real_rename(from, to);
}

int renameat(int fromfd, const char* from, int tofd, const char* to) {
  REAL(renameat);
  if ((under_fault_dir(from) || under_fault_dir(to)) && fault("renameat", to) != 0) return -1;
  return real_renameat(fromfd, from, tofd, to);
}

int renameat2(int fromfd, const char* from, int tofd, const char* to, unsigned flags) {
  REAL(renameat2);
  if (under_fault_dir(from) || under_fault_dir(to)) {
    if (env("SEQPACK_FAULT_NO_EXCHANGE") != NULL && (flags & RENAME_EXCHANGE)) {
      errno = EINVAL;
      return -1;
    }
    if (fault("renameat2", to) != 0) return -1;
  }
  return real_renameat2(fromfd, from, tofd, to, flags);
}

int mkdir(const char* path, mode_t mode) {
  REAL(mkdir);
  if (under_fault_dir(path) && fault("mkdir", path) != 0) return -1;
  return real_mkdir(path, mode);
}

int unlink(const char* path) {
  REAL(unlink);
  if (under_fault_dir(path) && fault("unlink", path) != 0) return -1;
  return real_unlink(path);
}

int unlinkat(int dirfd, const char* path, int flags) {
  REAL(unlinkat);
  if (under_fault_dir(path) && fault("unlinkat", path) != 0) return -1;
  return real_unlinkat(dirfd, path, flags);
}

int rmdir(const char* path) {
  REAL(rmdir);
  if (under_fault_dir(path) && fault("rmdir", path) != 0) return -1;
  return real_rmdir(path);
}

// With SEQPACK_FAULT_MALLOC_OVER=N, malloc of more than N bytes fails (NULL,
// ENOMEM), as when memory runs out: operator new then throws std::bad_alloc.
// Smaller blocks are allocated as usual, so the process starts and runs.
extern void* __libc_malloc(size_t size);
void* malloc(size_t size) {
  static long limit = -2;  // -2: not read yet; -1: no limit
  if (limit == -2) {
    const char* over = env("SEQPACK_FAULT_MALLOC_OVER");
    limit = over != NULL ? atol(over) : -1;
  }
  if (limit >= 0 && size > (size_t)limit) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_malloc(size);
}
