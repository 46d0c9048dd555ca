/* bitship kernel ABI: the only header a kernel author needs.
 *
 * A kernel is a C function with external linkage and this signature:
 *
 *     #include <bitship/kernel.h>
 *     struct add_args { uint64_t a, b; };
 *     BS_KERNEL(add) {
 *         size_t len;
 *         const struct add_args* in = (const struct add_args*)bs_args(ctx, &len);
 *         if (len != sizeof *in) return (void)bs_fail(ctx, 1, "add: expected 16 bytes of arguments");
 *         uint64_t sum = in->a + in->b;
 *         bs_reply(ctx, &sum, sizeof sum);
 *     }
 *
 * It is compiled to LLVM bitcode by bitship_add_kernels(), shipped to an agent, JIT-compiled
 * there and linked only against this runtime, a curated libc/libm subset and what the agent's
 * operator exports. A kernel answers once, with bs_reply or bs_fail; one that returns without
 * answering answers with an empty result.
 */
#ifndef BITSHIP_KERNEL_H
#define BITSHIP_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The call a kernel is running for; owned by the agent, valid until the kernel returns. */
typedef struct bs_ctx bs_ctx;

/** The signature every kernel entry has. */
typedef void (*bs_entry_fn)(bs_ctx* ctx);

/** Status codes the runtime functions return. */
enum {
    BS_OK = 0,
    BS_EALREADY = -1, /**< the call was already answered */
    BS_ETOOLARGE = -2, /**< the reply exceeds the agent's result limit */
    BS_EINVAL = -3, /**< a null pointer with a non-zero length, or a null ctx */
    BS_ENOPEER = -4, /**< no peer of that index in the call's peer table */
    BS_EHOPS = -5, /**< the hop budget is spent: the caller gets hop_budget_exceeded */
    BS_ENOMEM = -6 /**< a region could not be created */
};

/** The argument bytes of this call, 16-byte aligned; `*len` receives their size (may be 0).
 *  Never null. */
const void* bs_args(bs_ctx* ctx, size_t* len);

/** Answers the call with `len` bytes, copied before return. Returns BS_OK or BS_E*. */
int bs_reply(bs_ctx* ctx, const void* data, size_t len);

/** Answers the call with an error: the caller's future fails with Errc::kernel_failed,
 *  carrying `code` and `message` (copied, truncated to 1 KiB). Returns BS_OK or BS_E*. */
int bs_fail(bs_ctx* ctx, int code, const char* message);

/** Memory region `name` of this agent: its base address, with its size in `*size`; NULL (and
 *  size 0) when the agent has no region of that name. Regions are registered for RDMA, so
 *  clients can read and write them with one-sided GET/PUT too. */
void* bs_region(bs_ctx* ctx, const char* name, size_t* size);

/** Creates region `name` of `size` zeroed bytes on this agent (or returns the existing one of
 *  that name, whatever its size; `*size` says). NULL when it cannot be made. */
void* bs_region_create(bs_ctx* ctx, const char* name, size_t size, size_t* actual);

/** This agent's index in the call's peer table; `*count` receives the table's size (0 when
 *  the caller shipped none, and then the result is -1). */
int bs_self(bs_ctx* ctx, uint32_t* count);

/** Runs this same kernel on peer `peer` with `len` bytes of new arguments. Whatever that run
 *  answers goes straight to the original caller, so after BS_OK this kernel must not answer.
 *  BS_EHOPS: the call's hop budget is spent, and the caller is told so. */
int bs_forward(bs_ctx* ctx, uint32_t peer, const void* args, size_t len);

/** Like bs_forward, but runs kernel `entry` of the same bundle. */
int bs_ship(bs_ctx* ctx, uint32_t peer, const char* entry, const void* args, size_t len);

#ifdef __cplusplus
}
#define BS_KERNEL_LINKAGE extern "C"
#else
#define BS_KERNEL_LINKAGE
#endif

/** Defines kernel `name`; its body sees `bs_ctx* ctx`. */
#define BS_KERNEL(name)                                                                            \
    BS_KERNEL_LINKAGE __attribute__((visibility("default"), used)) void name(bs_ctx* ctx)

#endif /* BITSHIP_KERNEL_H */
