# ZeRO-3 storage of the dense weights with whole local experts (core/model/zero_params.*) on real
# rank processes, against the single-rank ParamStore. Included from tests/parallel/CMakeLists.txt.
# Run: ctest -R zero_params --output-on-failure
moepeak_add_mpi_test(test_zero_params NP 4
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_zero_params.cpp)
moepeak_mpi_run(test_zero_params_np2 NP 2 TARGET test_zero_params)
# AdamW over the ZeRO-3 pieces against AdamW over the whole model.
moepeak_add_mpi_test(test_zero_adamw NP 4 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_zero_adamw.cpp)
moepeak_mpi_run(test_zero_adamw_np2 NP 2 TARGET test_zero_adamw)
