// A GPU kernel's declared geometry (BS_GPU_GEOMETRY), read back from PTX as LLVM's NVPTX back
// end writes it. The PTX comes from a client's slice: every malformed form reads as none.
#include <catch2/catch.hpp>

#include "ptx_geometry.hpp"

namespace ptx_geometry_test_cpp {

using namespace bitship::agent;

TEST_CASE("a declared geometry reads from the PTX's bytes or words, trailing zeros left out", "[unit]") {
    // As LLVM 19 writes [2 x i32] [i32 128, i32 2]: little-endian bytes, the trailing zeros cut.
    const char* bytes = ".version 8.0\n.target sm_90\n.visible .global .align 4 .b8 bs_gpu_geometry_where[8] = {128, 0, 0, 0, 2};\n";
    auto g = declared_geometry(bytes, "where");
    REQUIRE(g);
    CHECK(g->threads == 128);
    CHECK(g->blocks_per_sm == 2);

    auto big = declared_geometry(".visible .global .align 4 .b8 bs_gpu_geometry_k[8] = {0, 4, 0, 0, 1, 1};", "k");
    REQUIRE(big);
    CHECK(big->threads == 1024);
    CHECK(big->blocks_per_sm == 257);

    auto words = declared_geometry(".visible .const .align 4 .u32 bs_gpu_geometry_k[2] = {512, 4};", "k");
    REQUIRE(words);
    CHECK(words->threads == 512);
    CHECK(words->blocks_per_sm == 4);

    auto zeros = declared_geometry(".visible .global .align 4 .b8 bs_gpu_geometry_k[8];", "k");
    CHECK_FALSE(zeros); // no initialiser: nothing declared that this reader can trust
}

TEST_CASE("another kernel's geometry, a longer name, or a malformed declaration reads as none", "[unit]") {
    const char* ptx = ".visible .global .align 4 .b8 bs_gpu_geometry_sum_u64[8] = {0, 2, 0, 0, 4};\n"
                      ".visible .global .align 4 .b8 xbs_gpu_geometry_sum[8] = {64};\n";
    CHECK_FALSE(declared_geometry(ptx, "sum"));     // only sum_u64's, and a name that merely ends like it
    CHECK(declared_geometry(ptx, "sum_u64"));
    CHECK_FALSE(declared_geometry(ptx, "other"));
    CHECK_FALSE(declared_geometry("", "k"));
    for (const char* bad : {".b8 bs_gpu_geometry_k[8] = {300};",                 // a byte over 255
                            ".b8 bs_gpu_geometry_k[8] = {1, 2, 3, 4, 5, 6, 7, 8, 9};", // more than two words
                            ".b8 bs_gpu_geometry_k[8] = {1, x};",                // not a number
                            ".b8 bs_gpu_geometry_k[8] = {1, 2",                  // no closing brace
                            ".f32 bs_gpu_geometry_k[2] = {1, 2};",               // a type it does not read
                            ".u32 bs_gpu_geometry_k[2] = {4294967296, 1};"})     // a word over 32 bits
        CHECK_FALSE(declared_geometry(std::string(" ") + bad, "k"));
}

}  // namespace ptx_geometry_test_cpp
