# Expert-parallel dispatch (ops/schedules/dispatch_expert_parallel.*) on real rank processes,
# against StandardDispatch on one rank. Included from tests/parallel/CMakeLists.txt.
# Run: ctest -R expert_parallel --output-on-failure
moepeak_add_mpi_test(test_expert_parallel NP 4
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_expert_parallel.cpp)
moepeak_mpi_run(test_expert_parallel_2 NP 2 TARGET test_expert_parallel)
