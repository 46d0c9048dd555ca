// The handlers an agent may pre-install for comparison: each X-RDMA kernel's own source,
// compiled natively (kernels/<op>.c built with BS_<OP>_ENTRY=bs_native_<op>).
#include "chase.hpp"

extern "C" void bs_native_chase(bs_ctx* ctx);
extern "C" void bs_native_reduce(bs_ctx* ctx);
extern "C" void bs_native_filter(bs_ctx* ctx);
extern "C" void bs_native_hash_lookup(bs_ctx* ctx);

namespace bitship::xrdma {

std::vector<NativeKernel> native_kernels() {
    return {{"chase", &bs_native_chase},
            {"reduce", &bs_native_reduce},
            {"filter", &bs_native_filter},
            {"hash_lookup", &bs_native_hash_lookup}};
}

} // namespace bitship::xrdma
