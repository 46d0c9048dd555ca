// Catch2's main, alone in its file so that editing the tests does not recompile it.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
