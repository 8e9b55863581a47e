// moepeak::Error's two kinds (core/error.h): an internal error leads with host, rank and the C++
// file:line; an input error shows the user's terms only (and the host and rank in a job of
// several ranks). Both keep file() and line() for debugging.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace moepeak {
namespace {

std::string what_of(void (*raise)()) {
  try {
    raise();
  } catch (const Error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

void raise_input() { MOEPEAK_INPUT_ERROR("run.toml:3: unknown key 'model.hiden_size'"); }
void raise_input_check() { MOEPEAK_CHECK_INPUT(1 + 1 == 3, "data.bin: token 9 at offset 4"); }
void raise_internal() { MOEPEAK_CHECK(1 + 1 == 3, "arithmetic"); }

class ErrorKinds : public ::testing::Test {
 protected:
  void TearDown() override { set_process_identity(-1, 0); }
};

TEST_F(ErrorKinds, InputErrorOnOneProcessIsTheMessageAlone) {
  set_process_identity(0, 1);
  EXPECT_EQ(what_of(raise_input), "run.toml:3: unknown key 'model.hiden_size'");
  EXPECT_EQ(what_of(raise_input_check), "data.bin: token 9 at offset 4");
  set_process_identity(-1, 0);  // before the process group exists
  EXPECT_EQ(what_of(raise_input), "run.toml:3: unknown key 'model.hiden_size'");
}

TEST_F(ErrorKinds, InputErrorOnSeveralRanksNamesHostAndRankButNoSourceLine) {
  set_process_identity(3, 4);
  const std::string what = what_of(raise_input);
  EXPECT_EQ(what, "[" + process_host() + " rank 3/4] run.toml:3: unknown key 'model.hiden_size'");
  EXPECT_EQ(what.find("test_error.cpp"), std::string::npos) << what;
}

TEST_F(ErrorKinds, InternalErrorNamesTheSourceLine) {
  set_process_identity(0, 1);
  const std::string what = what_of(raise_internal);
  EXPECT_EQ(what.rfind("[" + process_host() + " rank 0/1] tests/runtime/test_error.cpp:", 0), 0u)
      << what;
  EXPECT_NE(what.find("check failed: 1 + 1 == 3: arithmetic"), std::string::npos) << what;
}

TEST_F(ErrorKinds, BothKindsKeepTheirLocationAndKind) {
  try {
    raise_input();
    FAIL() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    EXPECT_EQ(std::string(e.file()), "tests/runtime/test_error.cpp");
    EXPECT_GT(e.line(), 0);
    EXPECT_EQ(e.message(), "run.toml:3: unknown key 'model.hiden_size'");
  }
  try {
    raise_internal();
    FAIL() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::internal);
  }
}

TEST_F(ErrorKinds, NestedMessageDropsAnInputErrorsPrefixOnly) {
  set_process_identity(1, 2);
  try {
    raise_input();
  } catch (const Error& e) {
    EXPECT_EQ(nested_message(e), "run.toml:3: unknown key 'model.hiden_size'");
  }
  try {
    raise_internal();
  } catch (const Error& e) {
    EXPECT_EQ(nested_message(e), std::string(e.what()));
  }
}

}  // namespace
}  // namespace moepeak
