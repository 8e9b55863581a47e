# OffloadStreamAdamW and the serial CPU offload (ops/schedules/adamw_offload_*) over ZeRO-3
# pieces on real rank processes, against resident AdamW; training, checkpoints and resume on W
# ranks with each optimizer.placement. Included from tests/parallel/CMakeLists.txt.
# Run: ctest -R adamw_offload_parallel --output-on-failure
moepeak_add_mpi_test(test_adamw_offload_parallel NP 4
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_adamw_offload_parallel.cpp)
moepeak_mpi_run(test_adamw_offload_parallel_np2 NP 2 TARGET test_adamw_offload_parallel)
