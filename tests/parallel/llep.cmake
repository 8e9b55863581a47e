# LLEP and PipelinedLLEP dispatch (ops/schedules/dispatch_llep.*, dispatch_pipelined_llep.*) on
# real rank processes against the standard expert-parallel dispatcher, and `moepeak bench
# dispatch` on 2 ranks. Included from tests/parallel/CMakeLists.txt. The planner's own unit test
# is tests/ops/test_llep_plan.cpp.
# Run: ctest -R llep --output-on-failure
moepeak_add_mpi_test(test_llep NP 4 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_llep.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/test_llep_gpt_oss.cpp)
moepeak_mpi_run(test_llep_np2 NP 2 TARGET test_llep)
# The bf16 cases on one rank too (chunks and F blocks without peers).
add_test(NAME test_llep_np1_bf16
  COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 1
          $<TARGET_FILE:test_llep> --gtest_filter=*Bf16*)
set_tests_properties(test_llep_np1_bf16 PROPERTIES LABELS "mpi" PROCESSORS 1 TIMEOUT 300
  ENVIRONMENT "OMPI_MCA_btl=self,vader;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1")
# `moepeak bench dispatch` under mpirun -np 2: the §10 JSON's rows, bounds and errors.
add_test(NAME test_llep_bench_dispatch
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_llep_bench_dispatch.sh $<TARGET_FILE:moepeak>
          ${MPIEXEC_EXECUTABLE})
set_tests_properties(test_llep_bench_dispatch PROPERTIES LABELS "cli;mpi" PROCESSORS 2 TIMEOUT 300
  ENVIRONMENT "OMPI_MCA_btl=self,vader;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
# Whole training steps with schedules.dispatch = pipelined_llep / llep against one rank.
moepeak_add_mpi_test(test_train_llep NP 4 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_train_llep.cpp)
moepeak_mpi_run(test_train_llep_np2 NP 2 TARGET test_train_llep)
# `moepeak train --set schedules.dispatch=pipelined_llep` on 2 ranks against the standard job.
add_test(NAME test_train_llep_cli
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_train_llep_cli.sh $<TARGET_FILE:moepeak>
          ${MPIEXEC_EXECUTABLE} ${CMAKE_SOURCE_DIR})
set_tests_properties(test_train_llep_cli PROPERTIES LABELS "cli;mpi" PROCESSORS 2 TIMEOUT 300
  ENVIRONMENT "OMPI_MCA_btl=self,vader;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
