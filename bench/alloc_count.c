/* An LD_PRELOAD library that counts a process's heap calls, for bench/call_allocations.
 *
 * With BITSHIP_ALLOC_COUNT_DIR set, each process that loads it keeps its counts in a shared
 * file DIR/<pid> (struct bitship_alloc_counts, alloc_count.h) that another process reads while it
 * runs: malloc, calloc, realloc, the aligned allocations and free, each passed on to glibc's
 * own (__libc_malloc and friends, so no dlsym and no bootstrap allocation). Without the
 * variable it only passes the calls on. A forked child stops counting into its parent's file
 * and opens its own. Counting costs an atomic add on a shared line: a measuring tool, not for
 * timed runs. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc_count.h"

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);
extern void __libc_free(void*);

static struct bitship_alloc_counts* counts;

/* DIR/<pid> without snprintf (which may allocate). */
static void open_counts(void) {
    counts = NULL;
    const char* dir = getenv("BITSHIP_ALLOC_COUNT_DIR");
    if (dir == NULL || *dir == '\0') return;
    char path[4096];
    size_t n = strlen(dir);
    if (n + 24 > sizeof path) return;
    memcpy(path, dir, n);
    path[n++] = '/';
    char digits[24];
    size_t d = 0;
    for (unsigned long pid = (unsigned long)getpid(); pid > 0 || d == 0; pid /= 10) digits[d++] = (char)('0' + pid % 10);
    while (d > 0) path[n++] = digits[--d];
    path[n] = '\0';
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    void* p = MAP_FAILED;
    if (ftruncate(fd, sizeof(struct bitship_alloc_counts)) == 0)
        p = mmap(NULL, sizeof(struct bitship_alloc_counts), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) counts = (struct bitship_alloc_counts*)p;
}

static void in_child(void) { open_counts(); }

__attribute__((constructor)) static void start(void) {
    int saved = errno;
    open_counts();
    pthread_atfork(NULL, NULL, in_child);
    errno = saved;
}

static inline void count_alloc(size_t bytes) {
    struct bitship_alloc_counts* c = counts;
    if (c == NULL) return;
    atomic_fetch_add_explicit(&c->allocations, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->bytes, bytes, memory_order_relaxed);
}

static inline void count_free(void* p) {
    struct bitship_alloc_counts* c = counts;
    if (c == NULL || p == NULL) return;
    atomic_fetch_add_explicit(&c->frees, 1, memory_order_relaxed);
}

void* malloc(size_t n) {
    count_alloc(n);
    return __libc_malloc(n);
}

void* calloc(size_t k, size_t n) {
    count_alloc(k * n);
    return __libc_calloc(k, n);
}

void* realloc(void* p, size_t n) {
    if (p == NULL || n > 0) count_alloc(n);
    if (n == 0) count_free(p);
    return __libc_realloc(p, n);
}

void free(void* p) {
    count_free(p);
    __libc_free(p);
}

void* memalign(size_t align, size_t n) {
    count_alloc(n);
    return __libc_memalign(align, n);
}

void* aligned_alloc(size_t align, size_t n) {
    count_alloc(n);
    return __libc_memalign(align, n);
}

int posix_memalign(void** out, size_t align, size_t n) {
    if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
    count_alloc(n);
    void* p = __libc_memalign(align, n);
    if (p == NULL) return ENOMEM;
    *out = p;
    return 0;
}

void* valloc(size_t n) {
    count_alloc(n);
    return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), n);
}
