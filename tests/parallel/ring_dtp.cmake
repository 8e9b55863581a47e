# Ring-DTP (ops/schedules/vocab_ring_dtp.*) on real rank processes against MaterializedVocab on
# the gathered problem: 4 and 2 ranks (uneven vocabulary shards), and 1 rank (strips within the
# one shard), and `moepeak bench vocab` on 2 ranks. Included from tests/parallel/CMakeLists.txt.
# Run: ctest -R "ring_dtp|bench_vocab" --output-on-failure
moepeak_add_mpi_test(test_ring_dtp NP 4
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ring_dtp.cpp)
moepeak_mpi_run(test_ring_dtp_np2 NP 2 TARGET test_ring_dtp)
moepeak_mpi_run(test_ring_dtp_np1 NP 1 TARGET test_ring_dtp)
# `moepeak bench vocab` under mpirun -np 2: the §10 JSON's rows, bounds and errors.
add_test(NAME test_bench_vocab
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_vocab.sh $<TARGET_FILE:moepeak>
          ${MPIEXEC_EXECUTABLE})
set_tests_properties(test_bench_vocab PROPERTIES LABELS "cli;mpi" PROCESSORS 2 TIMEOUT 300
  ENVIRONMENT "OMPI_MCA_btl=self,vader;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
moepeak_mpi_run(test_ring_dtp_np8 NP 8 TARGET test_ring_dtp)
# The model with schedules.vocab = "ring_dtp" against "materialized" on the same ranks.
moepeak_add_mpi_test(test_model_ring_dtp NP 4
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_model_ring_dtp.cpp)
moepeak_mpi_run(test_model_ring_dtp_np2 NP 2 TARGET test_model_ring_dtp)
