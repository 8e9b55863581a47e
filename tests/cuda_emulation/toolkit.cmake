# The CPU emulation of the CUDA toolkit, where -DMOEPEAK_CUDA=EMULATED builds the CUDA backend
# (included by the top-level CMakeLists.txt after the layers are declared):
#   moepeak_rewrite_cu      the build-time rewrite of .cu files (rewrite_cu.cpp)
#   moepeak_cuda_emulation  cudart, cuBLAS, cuBLASLt and NCCL over MPI, with the headers in
#                           include/ and the fibers of device_threads.cpp
# and every ops/cuda/*.cu, rewritten, as a C++17 source of moepeak_ops.
set(MOEPEAK_EMULATION_DIR ${CMAKE_SOURCE_DIR}/tests/cuda_emulation)

add_executable(moepeak_rewrite_cu ${MOEPEAK_EMULATION_DIR}/rewrite_cu.cpp)
target_compile_options(moepeak_rewrite_cu PRIVATE ${MOEPEAK_CXX_WARNINGS})

add_library(moepeak_cuda_emulation STATIC
  ${MOEPEAK_EMULATION_DIR}/device_threads.cpp
  ${MOEPEAK_EMULATION_DIR}/runtime.cpp
  ${MOEPEAK_EMULATION_DIR}/errors.cpp
  ${MOEPEAK_EMULATION_DIR}/cublas.cpp
  ${MOEPEAK_EMULATION_DIR}/nccl.cpp)
moepeak_view(moepeak_cuda_emulation FOLDERS tests/cuda_emulation)
target_include_directories(moepeak_cuda_emulation PUBLIC ${MOEPEAK_VIEW}
  ${MOEPEAK_EMULATION_DIR}/include)
target_link_libraries(moepeak_cuda_emulation PUBLIC moepeak_base MPI::MPI_C)
target_compile_options(moepeak_cuda_emulation PRIVATE ${MOEPEAK_CXX_WARNINGS})

file(GLOB MOEPEAK_OPS_CU CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/ops/cuda/*.cu)
foreach(cu ${MOEPEAK_OPS_CU})
  get_filename_component(name ${cu} NAME)
  set(rewritten ${CMAKE_BINARY_DIR}/cuda_emulated/ops/cuda/${name}.cpp)
  add_custom_command(OUTPUT ${rewritten}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/cuda_emulated/ops/cuda
    COMMAND moepeak_rewrite_cu ${cu} ${rewritten} ops/cuda/${name}
    DEPENDS ${cu} moepeak_rewrite_cu
    COMMENT "rewrite_cu ops/cuda/${name}")
  # NOTES: nvcc compiles CUDA as C++17 (CMakeLists.txt); so does the emulation. #pragma unroll
  # means nothing to g++. Kernels pun through vector types (a uint4 load read as 8 bf16), which
  # nvcc honours and g++'s strict aliasing would not.
  # C++17, so not the layers' precompiled header (C++20).
  set_source_files_properties(${rewritten} PROPERTIES COMPILE_OPTIONS "-std=c++17;-Wno-unknown-pragmas;-fno-strict-aliasing"
    SKIP_PRECOMPILE_HEADERS ON)
  target_sources(moepeak_ops PRIVATE ${rewritten})
endforeach()
