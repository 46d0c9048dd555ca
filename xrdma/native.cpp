// The handlers an agent may pre-install for comparison: the chase kernel's own source,
// compiled natively (kernels/chase.c built with BS_CHASE_ENTRY=bs_native_chase).
#include "chase.hpp"

extern "C" void bs_native_chase(bs_ctx* ctx);

namespace bitship::xrdma {

std::vector<NativeKernel> native_kernels() { return {{"chase", &bs_native_chase}}; }

} // namespace bitship::xrdma
