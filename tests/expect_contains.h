// EXPECT_CONTAINS(haystack, needle): a non-fatal gtest expectation that `needle` occurs in
// `haystack` (each evaluated once), printing both when it does not — for error messages.
// error_of(fn): the message of the moepeak::Error `fn` throws; fails the test when none is.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace moepeak::test_support {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "no moepeak::Error thrown";
  return "";
}

inline void expect_contains(const std::string& haystack, const std::string& needle,
                            const char* file, int line) {
  if (haystack.find(needle) == std::string::npos) {
    ADD_FAILURE_AT(file, line) << "expected to find: " << needle
                               << "\n               in: " << haystack;
  }
}

}  // namespace moepeak::test_support

#define EXPECT_CONTAINS(haystack, needle) \
  ::moepeak::test_support::expect_contains((haystack), (needle), __FILE__, __LINE__)
