# tandem_use_shared_cxx_runtime(): every target created after the call, in this directory and
# below, links the shared C++ runtime (libstdc++.so.6) where the compiler would otherwise link
# the static libstdc++.a. tandem's own build calls it; tandemConfig.cmake defines it for a
# consumer's project (the Python package's and the examples' call it).
#
# Why: a GCC whose library directories hold libstdc++.a but no libstdc++.so (a relocated
# toolchain such as the H200 machine's /opt/gcc: `g++ -print-file-name=libstdc++.so` answers a
# bare name) links a private copy of the C++ runtime into each shared library, and exports its
# operator new/delete, __cxa_throw and std::string internals. In a Python process, where
# LibTorch already uses the system's libstdc++.so.6, tandem's modules then bind some runtime
# symbols to that copy and LibTorch to the other: the first C++ exception crashed ("free():
# invalid pointer", SIGSEGV) unless libstdc++.so.6 was preloaded. Naming the shared runtime
# among the link libraries resolves those symbols before the driver's implicit -lstdc++ is
# read, so no member of the archive is pulled in. tests/cxx_runtime_test.sh checks the result.
function(tandem_use_shared_cxx_runtime)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE dev_library OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(IS_ABSOLUTE "${dev_library}" AND EXISTS "${dev_library}")
    return()  # the usual case: -lstdc++ finds the shared library
  endif()
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so.6
                  OUTPUT_VARIABLE runtime OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT (IS_ABSOLUTE "${runtime}" AND EXISTS "${runtime}"))
    message(WARNING "${CMAKE_CXX_COMPILER} finds no libstdc++.so or libstdc++.so.6: shared "
            "libraries will carry a private copy of the C++ runtime, which crashes beside "
            "LibTorch's in one process (Python). Install the compiler's libstdc++ development "
            "package.")
    return()
  endif()
  message(STATUS "tandem: ${CMAKE_CXX_COMPILER} would link libstdc++ statically; linking the "
                 "shared ${runtime} instead")
  link_libraries("${runtime}")
endfunction()
