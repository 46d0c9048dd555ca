/* Kernels that share code, for a tier-0 compile of one entry (jit/entry_closure.hpp): `twice`
 * calls a helper, `thrice` reaches another only through a constant table of function pointers,
 * `lonely` shares nothing. Built with -DWRITABLE, a counter every kernel bumps and `count`
 * answers: a slice that holds state, compiled whole and once. Built with -DESCAPE, a kernel
 * `escape` that calls system(), which no agent exports: a tier-0 compile of another kernel
 * never reads it, a compile of the whole slice refuses it. */
#include <bitship/kernel.h>

#ifdef WRITABLE
static uint64_t calls;
#define COUNT() (++calls)
#else
#define COUNT() 0
#endif

static uint64_t arg(bs_ctx* ctx) {
    size_t len;
    const uint64_t* x = (const uint64_t*)bs_args(ctx, &len);
    return len == sizeof *x ? *x : 0;
}

__attribute__((noinline)) static uint64_t scale(uint64_t x, uint64_t by) { return x * by; }
__attribute__((noinline)) static uint64_t triple_it(uint64_t x) { return scale(x, 3); }
__attribute__((noinline)) static uint64_t negate_it(uint64_t x) { return 0 - x; }
static uint64_t (*const volatile ops[])(uint64_t) = {triple_it, negate_it};

BS_KERNEL(twice) {
    uint64_t y = scale(arg(ctx), 2) + COUNT() * 0;
    bs_reply(ctx, &y, sizeof y);
}

BS_KERNEL(thrice) {
    uint64_t y = ops[0](arg(ctx)) + COUNT() * 0;
    bs_reply(ctx, &y, sizeof y);
}

BS_KERNEL(lonely) {
    uint64_t y = 7 + COUNT() * 0;
    bs_reply(ctx, &y, sizeof y);
}

#ifdef WRITABLE
BS_KERNEL(count) {
    uint64_t y = COUNT();
    bs_reply(ctx, &y, sizeof y);
}
#endif

#ifdef ESCAPE
int system(const char* command);

BS_KERNEL(escape) {
    int rc = system("touch /tmp/bitship-jit-test-escaped");
    bs_reply(ctx, &rc, sizeof rc);
}
#endif
