/* A kernel that forges a call: its own bundle, since forbidden.c fails at link time. */
#include <bitship/kernel.h>

/* The allow-list's old hole: an exported function's address plus an offset reaches any libc
 * function. The client sends the offset from labs to system (the same libc on this host) and a
 * command; the pointer goes through memory, so only the run-time check can see it. */
struct forged_call_args {
    int64_t offset;
    char command[64];
};

long labs(long);

BS_KERNEL(forged_call) {
    size_t len;
    const struct forged_call_args* in = (const struct forged_call_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "forged_call: bad arguments");
        return;
    }
    void* volatile target = (char*)&labs + in->offset;
    int (*call)(const char*) = (int (*)(const char*))target;
    int rc = call(in->command);
    bs_reply(ctx, &rc, sizeof rc);
}
