/* A kernel that reaches for a symbol no agent exports. */
#include <bitship/kernel.h>

int system(const char* command);

BS_KERNEL(run_shell) {
    int rc = system("echo pwned");
    bs_reply(ctx, &rc, sizeof rc);
}

