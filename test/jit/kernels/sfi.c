/* Kernels for the software fault isolation tests (sfi_test.cpp): forged pointers, stack data of
 * every kind (arrays, address-taken locals, VLAs, structs by value), global tables, deep
 * recursion and indirect calls. Built once as is, with -DSTATELESS (the writable table local:
 * a slice without state, whose first compile is tier 0), and with -DCASE=n for what sfi
 * refuses. */
#include <bitship/kernel.h>

#if !defined(CASE)

/* Writes `value` at `addr`, whatever it is. */
struct write_args {
    uint64_t addr, value;
};
BS_KERNEL(sfi_write) {
    size_t len;
    const struct write_args* in = (const struct write_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "sfi_write: expected 16 bytes");
        return;
    }
    *(volatile uint64_t*)(uintptr_t)in->addr = in->value;
    uint64_t done = 1;
    bs_reply(ctx, &done, sizeof done);
}

/* Replies the u64 at `addr`, whatever it is. */
BS_KERNEL(sfi_read) {
    size_t len;
    const uint64_t* in = (const uint64_t*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "sfi_read: expected 8 bytes");
        return;
    }
    uint64_t seen = *(volatile const uint64_t*)(uintptr_t)*in;
    bs_reply(ctx, &seen, sizeof seen);
}

static const uint32_t kTable[16] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
#if !defined(STATELESS)
static uint32_t counts[16];
#endif

struct big {
    uint64_t v[6];
};

__attribute__((noinline)) static uint64_t sum_big(struct big b, uint32_t k) {
    uint64_t s = 0;
    for (uint32_t i = 0; i < 6; ++i) s += b.v[(i + k) % 6] * (i + 1);
    return s;
}

__attribute__((noinline)) static void add_to(uint64_t* p, uint64_t k) { *p += k; }

__attribute__((noinline)) static uint64_t use_vla(uint32_t n, uint32_t seed) {
    uint64_t vla[n];
    for (uint32_t i = 0; i < n; ++i) vla[i] = (uint64_t)seed * i ^ kTable[i & 15];
    uint64_t s = 0;
    for (uint32_t i = 0; i < n; ++i) s += vla[(i * 7) % n] * (i + 1);
    return s;
}

/* Local arrays (indexed by a variable), an address-taken local, a VLA, a struct by value, a
 * read-only and a writable global table, a long memcpy and a short memset. */
struct compute_args {
    uint32_t n, seed;
};
BS_KERNEL(sfi_compute) {
    size_t len;
    const struct compute_args* in = (const struct compute_args*)bs_args(ctx, &len);
    if (len != sizeof *in || in->n == 0 || in->n > 4096) {
        bs_fail(ctx, 1, "sfi_compute: expected n in 1..4096 and a seed");
        return;
    }
    const uint32_t n = in->n, seed = in->seed;
#if defined(STATELESS)
    uint32_t counts[16];
#endif
    for (uint32_t i = 0; i < 16; ++i) counts[i] = 0;
    uint64_t local[64];
    for (uint32_t i = 0; i < 64; ++i) local[i] = (uint64_t)kTable[(seed + i) & 15] * (i + 1);
    uint64_t copy[64];
    __builtin_memcpy(copy, local, sizeof copy);
    add_to(&copy[seed % 64], seed);
    uint64_t acc = copy[seed % 64] + copy[(seed + 1) % 64];
    add_to(&acc, copy[(seed + 2) % 64]);
    for (uint32_t i = 0; i < n; ++i) counts[(seed + i * 5) & 15] += kTable[i & 15];
    struct big b;
    for (uint32_t i = 0; i < 6; ++i) b.v[i] = local[(seed + i) % 64] + seed;
    acc += sum_big(b, seed);
    acc += use_vla(n, seed);
    for (uint32_t i = 0; i < 16; ++i) acc = acc * 31 + counts[i] * (i + 3);
    bs_reply(ctx, &acc, sizeof acc);
}

/* Recursion whose every frame keeps 512 bytes of address-taken data. */
__attribute__((noinline)) static uint64_t dive(uint32_t depth, volatile uint64_t* parent) {
    volatile uint64_t frame[64];
    frame[0] = parent ? parent[0] + 1 : 1;
    frame[depth % 64] = frame[0] + depth;
    if (depth == 0) return frame[0];
    return dive(depth - 1, frame) + frame[depth % 64];
}
BS_KERNEL(sfi_recurse) {
    size_t len;
    const uint32_t* in = (const uint32_t*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "sfi_recurse: expected 4 bytes");
        return;
    }
    uint64_t r = dive(*in, 0);
    bs_reply(ctx, &r, sizeof r);
}

/* Calls `fn` (or the kernel's own `twice` when it is null). */
typedef uint64_t (*fn_t)(uint64_t);
__attribute__((noinline)) static uint64_t twice(uint64_t x) { return 2 * x; }
struct indirect_args {
    fn_t fn;
    uint64_t x;
};
BS_KERNEL(sfi_indirect) {
    size_t len;
    const struct indirect_args* in = (const struct indirect_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "sfi_indirect: expected 16 bytes");
        return;
    }
    fn_t f = in->fn ? in->fn : twice;
    uint64_t r = f(in->x);
    bs_reply(ctx, &r, sizeof r);
}

#elif CASE == 1 /* a variadic function: va_arg would read the real stack */
#include <stdarg.h>
__attribute__((noinline)) static uint64_t sum(int n, ...) {
    va_list ap;
    va_start(ap, n);
    uint64_t s = 0;
    for (int i = 0; i < n; ++i) s += va_arg(ap, uint64_t);
    va_end(ap);
    return s;
}
BS_KERNEL(sfi_varargs) {
    uint64_t r = sum(3, (uint64_t)1, (uint64_t)2, (uint64_t)3);
    bs_reply(ctx, &r, sizeof r);
}

#elif CASE == 2 /* one load of 8 KiB: wider than the guard after the arena may cover */
typedef unsigned char wide __attribute__((vector_size(8192)));
BS_KERNEL(sfi_wide) {
    size_t len;
    const wide* in = (const wide*)bs_args(ctx, &len);
    wide v = *in;
    unsigned char first = v[0];
    bs_reply(ctx, &first, 1);
}
#elif CASE == 3 /* a load through the gs segment: the thread's own data, not the arena */
BS_KERNEL(sfi_segment) {
    uint64_t v = *(const __seg_gs uint64_t*)(uintptr_t)16;
    bs_reply(ctx, &v, sizeof v);
}
#elif CASE == 4 /* the sandbox's own symbols: the pass's, not the kernel's */
void* __bs_unsafe_stack(void);
BS_KERNEL(sfi_reserved) {
    void* p = __bs_unsafe_stack();
    bs_reply(ctx, &p, sizeof p);
}
#endif
