/* Hash-table lookup, as a kernel: walk the chain of one bucket of a table spread over the
 * agents' "hash" regions until the key is found or the chain ends. While the next entry is
 * here, walk locally; when it lives on another agent, forward the walk there (bs_forward), so
 * the agent holding the last entry read answers the caller directly. With come_back set, it
 * answers the bs_hash_args to go on with instead, and the caller ships them on.
 *
 * The same source is compiled twice: to bitcode (what bitship ships) and natively into xagent
 * (BS_HASH_LOOKUP_ENTRY=bs_native_hash_lookup). */
#include <bitship/kernel.h>

#include "hash_lookup_abi.h"

#ifndef BS_HASH_LOOKUP_ENTRY
#define BS_HASH_LOOKUP_ENTRY hash_lookup
#endif

BS_KERNEL(BS_HASH_LOOKUP_ENTRY) {
    size_t len = 0;
    const struct bs_hash_args* in = (const struct bs_hash_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, BS_HASH_EARGS, "hash_lookup: expected {key, addr, position, limit, at_bucket, come_back} (32 bytes)");
        return;
    }
    if (in->at_bucket > 1 || in->come_back > 1 || in->position > in->limit) {
        bs_fail(ctx, BS_HASH_EARGS, "hash_lookup: at_bucket and come_back must be 0 or 1, position at most limit");
        return;
    }
    size_t size = 0;
    const unsigned char* base = (const unsigned char*)bs_region(ctx, BS_HASH_REGION, &size);
    if (!base) {
        bs_fail(ctx, BS_HASH_ENOREGION, "hash_lookup: this agent has no region '" BS_HASH_REGION "'");
        return;
    }
    uint32_t peers = 0;
    int self = bs_self(ctx, &peers);
    if (self < 0) self = 0; /* a single agent, called without a peer table */

    uint64_t key = in->key, addr = in->addr;
    uint32_t position = in->position, limit = in->limit, at_bucket = in->at_bucket;
    struct bs_hash_result out = {0, 0, 0};
    for (;;) {
        if (addr == BS_HASH_NULL) break; /* an empty bucket, or the chain's end: not found */
        uint64_t owner = BS_HASH_OWNER(addr);
        if (owner != (uint64_t)self) {
            if (owner >= peers) {
                bs_fail(ctx, BS_HASH_ENOPEER, "hash_lookup: the next entry lives on an agent outside the peer table");
                return;
            }
            struct bs_hash_args next = {key, addr, position, limit, at_bucket, in->come_back};
            if (in->come_back) {
                bs_reply(ctx, &next, sizeof next);
                return;
            }
            int rc = bs_forward(ctx, (uint32_t)owner, &next, sizeof next);
            /* Forwarded, or the hop budget is spent and the caller told so. */
            if (rc != BS_OK && rc != BS_EHOPS) bs_fail(ctx, BS_HASH_ENOPEER, "hash_lookup: cannot forward the walk");
            return;
        }
        uint64_t offset = BS_HASH_OFFSET(addr);
        uint64_t need = at_bucket ? sizeof(uint64_t) : sizeof(struct bs_hash_entry);
        if (offset % sizeof(uint64_t) != 0 || size < need || offset > size - need) {
            bs_fail(ctx, BS_HASH_ERANGE, "hash_lookup: address outside region '" BS_HASH_REGION "' or misaligned");
            return;
        }
        if (at_bucket) {
            addr = *(const uint64_t*)(base + offset);
            at_bucket = 0;
            continue;
        }
        if (position >= limit) {
            bs_fail(ctx, BS_HASH_ELIMIT, "hash_lookup: chain longer than the walk's limit (a cycle in the table?)");
            return;
        }
        const struct bs_hash_entry* e = (const struct bs_hash_entry*)(base + offset);
        ++position;
        if (e->key == key) {
            out.found = 1;
            out.value = e->value;
            break;
        }
        addr = e->next;
    }
    out.position = position;
    bs_reply(ctx, &out, sizeof out);
}
