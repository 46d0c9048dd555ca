/* Tries to reach outside the allow-list: must never link. */
#include <bitship/kernel.h>

int system(const char* command);

BS_KERNEL(escape) {
    int rc = system("touch /tmp/bitship-jit-test-escaped");
    bs_reply(ctx, &rc, sizeof rc);
}
