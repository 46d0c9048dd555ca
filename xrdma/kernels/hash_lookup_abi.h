/* What the hash-lookup kernel, its native twin and the client agree on. */
#ifndef BITSHIP_XRDMA_HASH_LOOKUP_ABI_H
#define BITSHIP_XRDMA_HASH_LOOKUP_ABI_H

#include <stdint.h>

/* Each agent's "hash" region holds its share of the buckets (one global entry address each),
 * then its share of the entries. A global address is laid out as the chase's: owning agent
 * (index in the peer table) in the top 16 bits, byte offset into its "hash" region below. */
#define BS_HASH_REGION "hash"
#define BS_HASH_OWNER(addr) ((addr) >> 48)
#define BS_HASH_OFFSET(addr) ((addr) & ((1ull << 48) - 1))
#define BS_HASH_ADDRESS(owner, offset) (((uint64_t)(owner) << 48) | (uint64_t)(offset))
#define BS_HASH_NULL UINT64_MAX /* no entry: an empty bucket, the end of a chain */

struct bs_hash_entry {
    uint64_t key;
    uint64_t value;
    uint64_t next; /* global address of the next entry of the chain, or BS_HASH_NULL */
};

struct bs_hash_args {
    uint64_t key;       /* what is looked up */
    uint64_t addr;      /* the bucket's slot (at_bucket), else the next entry to read */
    uint32_t position;  /* entries read so far */
    uint32_t limit;     /* entries the walk may read before it fails (a cycle in the table) */
    uint32_t at_bucket; /* 1: addr is a bucket slot; 0: an entry */
    uint32_t come_back; /* 0: forward the walk between agents; 1: answer the bs_hash_args to go on
                           with where the next entry lives on another agent (strategy reship) */
};

struct bs_hash_result {
    uint64_t found;    /* 1 when the key is in the table */
    uint64_t value;    /* its value (0 when not found) */
    uint64_t position; /* its position in the chain, from 1; entries read when not found */
};

/* bs_fail codes */
enum { BS_HASH_EARGS = 1, BS_HASH_ENOREGION = 2, BS_HASH_ERANGE = 3, BS_HASH_ENOPEER = 4, BS_HASH_ELIMIT = 5 };

#endif
