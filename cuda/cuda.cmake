# The CUDA backend (cuda/backend.cu): cuBLAS sgemm plus freshet's kernels,
# registered in trainer/backend.c through FRESHET_HAVE_CUDA. It implements
# trainer/backend.h over the model of model/model.h. Included by the
# top-level CMakeLists.txt after enable_language(CUDA).
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
add_library(fr_cuda STATIC ${FRESHET_CUDA_SOURCES})
target_include_directories(fr_cuda PRIVATE ${CMAKE_SOURCE_DIR})
target_compile_options(fr_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
if(FRESHET_WERROR)
    target_compile_options(fr_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
target_link_libraries(fr_cuda PUBLIC fr_model fr_common CUDA::cudart CUDA::cublas)
target_compile_definitions(fr_trainer PRIVATE FRESHET_HAVE_CUDA=1)
target_link_libraries(fr_trainer PUBLIC fr_cuda)
message(STATUS "freshet: CUDA backend for architectures ${CMAKE_CUDA_ARCHITECTURES}")
