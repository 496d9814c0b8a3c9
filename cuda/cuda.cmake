# The CUDA backend (cuda/backend.cu): cuBLAS sgemm plus freshet's kernels,
# built as a module (libfreshet_cuda.so) that trainer/backend.c loads the
# first time a backend needs it (FRESHET_HAVE_CUDA): linked into the
# program, cuBLAS's constructors cost every command about 0.35 s of CPU and
# 100 MB at start, GPU or not (docs/design.md "The CUDA module"). It
# implements trainer/backend.h over the model of model/model.h and takes
# fr_errorf and the log from the program (cuda/exports.list). Included by
# the top-level CMakeLists.txt after enable_language(CUDA).
find_package(CUDAToolkit REQUIRED)
include(GNUInstallDirs)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
add_library(freshet_cuda MODULE ${FRESHET_CUDA_SOURCES})
# installed, it keeps the toolkit's folder (not a system one) to find cuBLAS
set_target_properties(freshet_cuda PROPERTIES PREFIX "lib" CUDA_RUNTIME_LIBRARY Shared
                                              LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
                                              INSTALL_RPATH ${CUDAToolkit_LIBRARY_DIR})
target_include_directories(freshet_cuda PRIVATE ${CMAKE_SOURCE_DIR})
target_compile_options(freshet_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
if(FRESHET_WERROR)
    target_compile_options(freshet_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
target_link_libraries(freshet_cuda PRIVATE CUDA::cudart CUDA::cublas)
install(TARGETS freshet_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/freshet)

# Where trainer/backend.c looks: beside the program (the build tree), the
# installed folder relative to the program's, then this build tree's file
# (for the test programs in build/tests, and only for programs in it).
file(RELATIVE_PATH FRESHET_CUDA_MODULE_REL ${CMAKE_INSTALL_FULL_BINDIR}
     ${CMAKE_INSTALL_FULL_LIBDIR}/freshet/libfreshet_cuda.so)
target_compile_definitions(
    fr_trainer PRIVATE FRESHET_HAVE_CUDA=1 FRESHET_CUDA_MODULE_REL="${FRESHET_CUDA_MODULE_REL}"
                       FRESHET_CUDA_MODULE_BUILT="$<TARGET_FILE:freshet_cuda>"
                       FRESHET_CUDA_BUILD_DIR="${CMAKE_BINARY_DIR}")
add_dependencies(fr_trainer freshet_cuda)
# every program with fr_trainer gives the module the symbols it takes
target_link_libraries(fr_trainer PUBLIC ${CMAKE_DL_LIBS})
target_link_options(fr_trainer INTERFACE
                    "LINKER:--dynamic-list=${CMAKE_SOURCE_DIR}/cuda/exports.list")
message(STATUS "freshet: CUDA backend module for architectures ${CMAKE_CUDA_ARCHITECTURES}")
