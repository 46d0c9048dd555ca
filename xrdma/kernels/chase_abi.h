/* What the chase kernel, its native twin and the client agree on. */
#ifndef BITSHIP_XRDMA_CHASE_ABI_H
#define BITSHIP_XRDMA_CHASE_ABI_H

#include <stdint.h>

/* A global address: owning agent (its index in the peer table) in the top 16 bits, byte
 * offset into that agent's "chase" region below. */
#define BS_CHASE_OWNER(addr) ((addr) >> 48)
#define BS_CHASE_OFFSET(addr) ((addr) & ((1ull << 48) - 1))
#define BS_CHASE_ADDRESS(owner, offset) (((uint64_t)(owner) << 48) | (uint64_t)(offset))
#define BS_CHASE_REGION "chase"

struct bs_chase_node {
    uint64_t next;    /* global address of the next node */
    uint64_t payload; /* summed along the walk */
};

struct bs_chase_args {
    uint64_t addr;      /* where the walk stands */
    uint64_t remaining; /* hops still to take */
    uint64_t sum;       /* payloads summed so far */
};

/* The walk that comes back to its caller (strategy reship) instead of forwarding: where the next
 * node lives on another agent, the kernel answers the bs_chase_args to go on with there, and the
 * caller ships it to that agent. */
struct bs_chase_come_back {
    struct bs_chase_args walk;
    uint64_t come_back; /* 1 */
};

struct bs_chase_result {
    uint64_t addr; /* the node reached after the last hop */
    uint64_t sum;  /* payloads of every node visited before it */
};

/* bs_fail codes */
enum { BS_CHASE_EARGS = 1, BS_CHASE_ENOREGION = 2, BS_CHASE_ERANGE = 3, BS_CHASE_ENOPEER = 4 };

#endif
