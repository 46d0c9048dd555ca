/* The pointer chase, as a kernel: walk `remaining` nodes of a linked list that lives in the
 * agents' "chase" regions, starting at global address `addr`, summing payloads. While the
 * next node is here, walk locally; when it lives on another agent, forward the walk there
 * (bs_forward), so the last agent answers the caller directly. Called with a
 * bs_chase_come_back instead, it answers where the walk stands (a bs_chase_args) and the caller
 * ships it on.
 *
 * The same source is compiled twice: to bitcode (what bitship ships) and natively into xagent
 * (the pre-installed handler it is measured against), so the two differ only in who compiled
 * them and when. */
#include <bitship/kernel.h>

#include "chase_abi.h"

#ifndef BS_CHASE_ENTRY
#define BS_CHASE_ENTRY chase
#endif

BS_KERNEL(BS_CHASE_ENTRY) {
    size_t len = 0;
    const struct bs_chase_args* in = (const struct bs_chase_args*)bs_args(ctx, &len);
    int come_back = 0;
    if (len == sizeof(struct bs_chase_come_back)) {
        const struct bs_chase_come_back* cb = (const struct bs_chase_come_back*)in;
        if (cb->come_back != 1) {
            bs_fail(ctx, BS_CHASE_EARGS, "chase: come_back must be 1");
            return;
        }
        come_back = 1;
    } else if (len != sizeof *in) {
        bs_fail(ctx, BS_CHASE_EARGS, "chase: expected {addr, remaining, sum} or {addr, remaining, sum, come_back}");
        return;
    }
    size_t size = 0;
    const unsigned char* base = (const unsigned char*)bs_region(ctx, BS_CHASE_REGION, &size);
    if (!base) {
        bs_fail(ctx, BS_CHASE_ENOREGION, "chase: this agent has no region '" BS_CHASE_REGION "'");
        return;
    }
    uint32_t peers = 0;
    int self = bs_self(ctx, &peers);
    if (self < 0) self = 0; /* a single agent, called without a peer table */

    uint64_t addr = in->addr, remaining = in->remaining, sum = in->sum;
    while (remaining) {
        uint64_t owner = BS_CHASE_OWNER(addr);
        if (owner != (uint64_t)self) {
            if (owner >= peers) {
                bs_fail(ctx, BS_CHASE_ENOPEER, "chase: next node lives on an agent outside the peer table");
                return;
            }
            struct bs_chase_args next = {addr, remaining, sum};
            if (come_back) {
                bs_reply(ctx, &next, sizeof next);
                return;
            }
            if (bs_forward(ctx, (uint32_t)owner, &next, sizeof next) != BS_OK && !peers) {
                bs_fail(ctx, BS_CHASE_ENOPEER, "chase: cannot forward");
            }
            return;
        }
        uint64_t offset = BS_CHASE_OFFSET(addr);
        if (offset % sizeof(struct bs_chase_node) != 0 || offset > size - sizeof(struct bs_chase_node) ||
            size < sizeof(struct bs_chase_node)) {
            bs_fail(ctx, BS_CHASE_ERANGE, "chase: address outside region '" BS_CHASE_REGION "'");
            return;
        }
        const struct bs_chase_node* node = (const struct bs_chase_node*)(base + offset);
        sum += node->payload;
        addr = node->next;
        --remaining;
    }
    struct bs_chase_result out = {addr, sum};
    bs_reply(ctx, &out, sizeof out);
}
