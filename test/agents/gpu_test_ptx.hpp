#pragma once
// Hand-written PTX for the GpuDevice tests on a real GPU: checked by ptxas where the toolkit is
// (test/agents/gpu_real_test.cpp), run on a GPU by test/gpu/gpu_device_real_test.cpp.

namespace bitship::test {

// The test kernels, each with the parameters every GPU kernel gets: (args, result, regions).
inline constexpr const char* kTestPtx = R"(.version 8.0
.target sm_90
.address_size 64

// result[0] = args[0] + args[1], by thread 0 of block 0.
.visible .entry sum_u64(.param .u64 sum_args, .param .u64 sum_result, .param .u64 sum_regions)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    or.b32 %r3, %r1, %r2;
    setp.ne.u32 %p1, %r3, 0;
    @%p1 bra SUM_DONE;
    ld.param.u64 %rd1, [sum_args];
    ld.param.u64 %rd2, [sum_result];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.u64 %rd5, [%rd3];
    ld.global.u64 %rd6, [%rd3+8];
    add.s64 %rd7, %rd5, %rd6;
    st.global.u64 [%rd4], %rd7;
SUM_DONE:
    ret;
}

// Region 0's u64 number i = args[1] + i, for i < args[0]: one thread each.
.visible .entry fill_region(.param .u64 fill_args, .param .u64 fill_result, .param .u64 fill_regions)
{
    .reg .pred %p<2>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [fill_args];
    ld.param.u64 %rd2, [fill_regions];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.u64 %rd5, [%rd3];
    ld.global.u64 %rd6, [%rd3+8];
    ld.global.u64 %rd7, [%rd4];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.u32 %r4, %r1, %r2, %r3;
    cvt.u64.u32 %rd8, %r4;
    setp.ge.u64 %p1, %rd8, %rd5;
    @%p1 bra FILL_DONE;
    add.s64 %rd9, %rd6, %rd8;
    shl.b64 %rd10, %rd8, 3;
    add.s64 %rd11, %rd7, %rd10;
    st.global.u64 [%rd11], %rd9;
FILL_DONE:
    ret;
}

// Stores to address 8, which no allocation holds: CUDA_ERROR_ILLEGAL_ADDRESS.
.visible .entry bad_address(.param .u64 bad_args, .param .u64 bad_result, .param .u64 bad_regions)
{
    .reg .b64 %rd<3>;
    mov.u64 %rd1, 8;
    mov.u64 %rd2, 42;
    st.global.u64 [%rd1], %rd2;
    ret;
}

// Waits for a value nobody writes: never returns.
.visible .entry spin_forever(.param .u64 spin_args, .param .u64 spin_result, .param .u64 spin_regions)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [spin_result];
    cvta.to.global.u64 %rd2, %rd1;
SPIN:
    ld.volatile.global.u64 %rd3, [%rd2];
    setp.ne.u64 %p1, %rd3, 12345;
    @%p1 bra SPIN;
    ret;
}
)";

} // namespace bitship::test
