/* Kernels with bulk answers, for the bulk window's tests (a bundle of its own: the size of
 * behaviours.c's bundle decides how its first call travels). */
#include <bitship/kernel.h>

/* Answers `n` bytes (its 8-byte argument, at most 1 MiB), each its offset's low byte: a large
 * result for small arguments. The bytes are made in a region of the agent's (memory a kernel
 * mallocs is freed when it returns, before its answer is sent). */
#define MANY_BYTES_MAX (1u << 20)
BS_KERNEL(many_bytes) {
    size_t len, size = 0;
    const uint64_t* n = (const uint64_t*)bs_args(ctx, &len);
    if (len != sizeof *n || *n > MANY_BYTES_MAX) {
        bs_fail(ctx, 1, "many_bytes: expected one uint64_t of at most 1 MiB");
        return;
    }
    unsigned char* buf = (unsigned char*)bs_region_create(ctx, "test.many_bytes", MANY_BYTES_MAX, &size);
    if (!buf || size < MANY_BYTES_MAX) {
        bs_fail(ctx, 2, "many_bytes: cannot make its region");
        return;
    }
    for (uint64_t i = 0; i < *n; ++i) buf[i] = (unsigned char)i;
    bs_reply(ctx, buf, *n);
}
