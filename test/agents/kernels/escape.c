/* Kernels that try to reach outside the sandbox: the agent must stop them or keep them inside
 * its arena, and serve the next call (test/agents/sandbox_test.cpp). Each is a bug or an attack
 * an authorized author could ship. */
#include <bitship/kernel.h>
#include <stdlib.h>
#include <string.h>

static uint64_t arg_u64(bs_ctx* ctx, unsigned i) {
    size_t len;
    const uint64_t* in = (const uint64_t*)bs_args(ctx, &len);
    return len >= (i + 1) * sizeof(uint64_t) ? in[i] : 0;
}

static void reply_u64(bs_ctx* ctx, uint64_t v) { bs_reply(ctx, &v, sizeof v); }

/* Writes `value` over 64 bytes at a forged address (arguments: address, value). */
BS_KERNEL(poke) {
    volatile uint64_t* p = (volatile uint64_t*)(uintptr_t)arg_u64(ctx, 0);
    uint64_t v = arg_u64(ctx, 1);
    for (int i = 0; i < 8; ++i) p[i] = v;
    reply_u64(ctx, 0);
}

/* Reads 8 bytes at a forged address (argument: address) and answers them. */
BS_KERNEL(peek) {
    volatile const uint64_t* p = (volatile const uint64_t*)(uintptr_t)arg_u64(ctx, 0);
    reply_u64(ctx, *p);
}

/* The same through memcpy and memset, the libc functions a kernel may call (arguments:
 * address, length). */
BS_KERNEL(copy_out) {
    char* p = (char*)(uintptr_t)arg_u64(ctx, 0);
    size_t n = (size_t)arg_u64(ctx, 1);
    char buf[256];
    memset(buf, 0x5a, sizeof buf);
    for (size_t done = 0; done < n; done += sizeof buf) memcpy(p + done, buf, n - done < sizeof buf ? n - done : sizeof buf);
    reply_u64(ctx, 0);
}

BS_KERNEL(copy_in) {
    const char* p = (const char*)(uintptr_t)arg_u64(ctx, 0);
    uint64_t v;
    memcpy(&v, p, sizeof v);
    reply_u64(ctx, v);
}

/* Answers the address of a fresh heap block filled with a pattern: a later call gets it back
 * as a pointer "from another call". */
BS_KERNEL(heap_pointer) {
    uint64_t* p = (uint64_t*)malloc(64);
    if (!p) return (void)bs_fail(ctx, 1, "heap_pointer: malloc failed");
    for (int i = 0; i < 8; ++i) p[i] = 0x1111111111111111ull * (uint64_t)(i + 1);
    reply_u64(ctx, (uint64_t)(uintptr_t)p);
}

/* Answers the base of region "scratch", with the offset in the argument added: a region
 * pointer kept and used past its region. */
BS_KERNEL(region_pointer) {
    size_t size;
    char* base = (char*)bs_region(ctx, "scratch", &size);
    if (!base) return (void)bs_fail(ctx, 1, "region_pointer: no region 'scratch'");
    uint64_t out[2] = {(uint64_t)(uintptr_t)base, (uint64_t)size};
    bs_reply(ctx, out, sizeof out);
}

/* bs_reply with a length the caller chooses, from a 16-byte local (argument: length). */
BS_KERNEL(overlong_reply) {
    char small[16] = "fifteen bytes..";
    uint64_t len = arg_u64(ctx, 0);
    int rc = bs_reply(ctx, small, (size_t)len);
    if (rc != BS_OK) reply_u64(ctx, (uint64_t)(int64_t)rc);
}

/* bs_reply from a forged address (arguments: address, length). */
BS_KERNEL(reply_from) {
    const void* p = (const void*)(uintptr_t)arg_u64(ctx, 0);
    bs_reply(ctx, p, (size_t)arg_u64(ctx, 1));
}

/* bs_args writing its length through a forged pointer (argument: address). */
BS_KERNEL(args_len_to) {
    size_t* where = (size_t*)(uintptr_t)arg_u64(ctx, 0);
    bs_args(ctx, where);
    reply_u64(ctx, 0);
}

/* Recursion whose frames hold an array the kernel passes on: it lives on the unsafe stack. */
static uint64_t deep(volatile char* previous, uint64_t depth) {
    volatile char frame[1024];
    frame[0] = (char)depth;
    frame[1023] = previous ? previous[0] : 0;
    if (depth == 0) return (uint64_t)frame[0];
    return deep(frame, depth - 1) + frame[1023];
}

BS_KERNEL(recurse) { reply_u64(ctx, deep(0, arg_u64(ctx, 0))); }

/* Recursion with no address-taken data: only the thread's own stack grows. The recursive call
 * goes through a pointer read each time, so the optimiser cannot make it a loop. */
static uint64_t plain(uint64_t depth);
static uint64_t (*volatile plain_again)(uint64_t) = plain;
static uint64_t plain(uint64_t depth) {
    if (depth == 0) return 0;
    uint64_t below = plain_again(depth - 1);
    return (below >> 1) ^ (below * depth) ^ depth;
}

BS_KERNEL(recurse_plain) { reply_u64(ctx, plain(arg_u64(ctx, 0))); }

/* Allocates `mib` MiB in 1 MiB blocks, touches every page, frees nothing (argument: mib). */
BS_KERNEL(leak) {
    uint64_t mib = arg_u64(ctx, 0);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < mib; ++i) {
        char* p = (char*)malloc(1u << 20);
        if (!p) return (void)bs_fail(ctx, 1, "leak: malloc answered NULL");
        for (size_t off = 0; off < (1u << 20); off += 4096) p[off] = (char)off;
        sum += (uint64_t)(uintptr_t)p[4096];
    }
    reply_u64(ctx, sum);
}

/* free() of something this call never allocated (argument: address). */
BS_KERNEL(bad_free) {
    free((void*)(uintptr_t)arg_u64(ctx, 0));
    reply_u64(ctx, 0);
}

/* An indirect call through a pointer the caller chose (argument: address). */
BS_KERNEL(call_address) {
    void (*volatile f)(void) = (void (*)(void))(uintptr_t)arg_u64(ctx, 0);
    f();
    reply_u64(ctx, 0);
}
