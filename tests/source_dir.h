// The repository's root folder as configured, for tests that read its files (configs/,
// tests/*/data). Defined in one generated file (tests/source_dir.cpp.in) so that no other compile
// command names the checkout's absolute path: a clone in another folder then reuses every other
// object from the compiler cache (docs/building.md).
#pragma once

#include <string>

namespace moepeak::test_support {

std::string source_dir();

}  // namespace moepeak::test_support
