/* What the reduce kernel, its native twin and the client agree on. */
#ifndef BITSHIP_XRDMA_REDUCE_ABI_H
#define BITSHIP_XRDMA_REDUCE_ABI_H

#include <stdint.h>

#include "array_abi.h"

enum { BS_REDUCE_SUM = 0, BS_REDUCE_MIN = 1, BS_REDUCE_MAX = 2 };

struct bs_reduce_args {
    uint64_t first; /* first item, counted from the start of this agent's region */
    uint64_t count; /* items to reduce */
    uint32_t op;    /* BS_REDUCE_SUM (wrapping), _MIN or _MAX */
    uint32_t reserved; /* 0 */
};

struct bs_reduce_result {
    uint64_t value; /* the sum, min or max; with count 0: 0, UINT64_MAX, 0 */
    uint64_t count; /* items reduced */
};

/* bs_fail codes */
enum { BS_REDUCE_EARGS = 1, BS_REDUCE_ENOREGION = 2, BS_REDUCE_ERANGE = 3 };

#endif
