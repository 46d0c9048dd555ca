// Catch2's main, compiled once for every test program (it is most of a test build's time), and
// alone in its file so that editing the tests does not recompile it.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
