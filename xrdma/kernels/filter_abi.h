/* What the filter kernel, its native twin and the client agree on. */
#ifndef BITSHIP_XRDMA_FILTER_ABI_H
#define BITSHIP_XRDMA_FILTER_ABI_H

#include <stdint.h>

#include "array_abi.h"

/* Item x matches when (bs_mix64(x) & 1023) < threshold: a threshold of selectivity * 1024 keeps
 * about that fraction of random items. */
#define BS_FILTER_THRESHOLD_MAX 1024u

static inline int bs_filter_match(uint64_t item, uint32_t threshold) {
    return (bs_mix64(item) & 1023u) < threshold;
}

struct bs_filter_args {
    uint64_t first;     /* first item, counted from the start of this agent's region */
    uint64_t count;     /* items to test */
    uint32_t threshold; /* 0..BS_FILTER_THRESHOLD_MAX */
    uint32_t reserved;  /* 0 */
};
/* The reply: the matching items (uint64_t each), in order. */

/* bs_fail codes */
enum { BS_FILTER_EARGS = 1, BS_FILTER_ENOREGION = 2, BS_FILTER_ERANGE = 3, BS_FILTER_ENOMEM = 4, BS_FILTER_ETOOLARGE = 5 };

#endif
