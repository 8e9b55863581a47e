// Paths of the synthetic topologies in tests/topology/data/ (see make_topologies.py there).
#pragma once

#include <string>

#include "tests/source_dir.h"

namespace moepeak::test_support {

inline std::string topology_data(const std::string& name) {
  return source_dir() + "/tests/topology/data/" + name;
}

}  // namespace moepeak::test_support
