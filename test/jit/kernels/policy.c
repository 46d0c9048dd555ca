/* Kernels the code policy refuses, one construct each (chosen with -DCASE=n). Each is what a
 * careless or hostile author might ship; none may reach LLVM's code generator. */
#include <bitship/kernel.h>

#if CASE == 1 /* inline assembly: once aborted the agent (no asm parser initialised) */
BS_KERNEL(bad) {
    uint64_t x = 0;
    __asm__ volatile("nop" : "+r"(x));
    bs_reply(ctx, &x, sizeof x);
}
#elif CASE == 2 /* module-level assembly */
__asm__(".globl stray\nstray: ret");
BS_KERNEL(bad) { bs_reply(ctx, 0, 0); }
#elif CASE == 3 /* a constructor: would run when the code is linked, before any call */
static int ran;
__attribute__((constructor)) static void init(void) { ran = 1; }
BS_KERNEL(bad) { bs_reply(ctx, &ran, sizeof ran); }
#elif CASE == 4 /* a thread-local */
static __thread uint64_t calls;
BS_KERNEL(bad) {
    ++calls;
    bs_reply(ctx, &calls, sizeof calls);
}
#elif CASE == 5 /* an alias */
BS_KERNEL(bad) { bs_reply(ctx, 0, 0); }
extern void bad_alias(bs_ctx*) __attribute__((alias("bad")));
#elif CASE == 6 /* an intrinsic that reads the machine's frame, not the kernel's data */
BS_KERNEL(bad) {
    void* frame = __builtin_frame_address(0);
    bs_reply(ctx, &frame, sizeof frame);
}
#elif CASE == 7 /* a call to an address made from an integer */
BS_KERNEL(bad) {
    ((void (*)(bs_ctx*))(uintptr_t)0x401000)(ctx);
}
#elif CASE == 8 /* a call to an exported function's address plus an offset */
void* memcpy(void*, const void*, unsigned long);
BS_KERNEL(bad) {
    size_t len;
    const int64_t* offset = (const int64_t*)bs_args(ctx, &len);
    ((void (*)(bs_ctx*))((char*)&memcpy + *offset))(ctx);
}
#elif CASE == 9 /* the return address: where the agent's own code is */
BS_KERNEL(bad) {
    void* back = __builtin_return_address(0);
    bs_reply(ctx, &back, sizeof back);
}
#elif CASE == 10 /* a computed goto: indirectbr jumps wherever its address says */
BS_KERNEL(bad) {
    size_t len;
    const int64_t* offset = (const int64_t*)bs_args(ctx, &len);
    static void* const labels[] = {&&one, &&two};
    void* where = (char*)labels[*offset & 1] + (*offset >> 1);
    uint64_t r = 0;
    goto *where;
one:
    r = 1;
two:
    bs_reply(ctx, &r, sizeof r);
}
#elif CASE == 11 /* data in the code section */
__attribute__((section(".text"))) const unsigned char payload[] = {0x0f, 0x05, 0xc3}; /* syscall; ret */
BS_KERNEL(bad) { bs_reply(ctx, payload, sizeof payload); }
#endif
