// Paths of the synthetic topologies in tests/topology/data/ (see make_topologies.py there).
#pragma once

#include <string>

namespace moepeak::test_support {

inline std::string topology_data(const std::string& name) {
  return std::string(MOEPEAK_SOURCE_DIR) + "/tests/topology/data/" + name;
}

}  // namespace moepeak::test_support
