# Warnings apply to our own targets only, never to the Debian headers we include.
set(SBX_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)

if(SBX_SANITIZE)
  set(SBX_SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options(${SBX_SAN_FLAGS})
  add_link_options(${SBX_SAN_FLAGS})
endif()

# sbx_cc_library(NAME name SRCS ... DEPS ...)
function(sbx_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(${A_NAME} STATIC ${A_SRCS})
  target_include_directories(${A_NAME} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${A_NAME} PRIVATE ${SBX_WARNINGS})
  target_link_libraries(${A_NAME} PUBLIC ${A_DEPS})
endfunction()

# sbx_cc_test(NAME name SRCS ... DEPS ... [LABELS ...] [TEST_PREFIX p] [PROPERTIES k v ...]): a
# GoogleTest binary registered with ctest; TEST_PREFIX goes in front of every test's name (ctest
# -R selects by it); PROPERTIES are set on each of its tests (e.g. FIXTURES_REQUIRED).
function(sbx_cc_test)
  if(NOT SBX_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(A "" "NAME;TEST_PREFIX" "SRCS;DEPS;LABELS;PROPERTIES" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_options(${A_NAME} PRIVATE ${SBX_WARNINGS})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  include(GoogleTest)
  # An empty LABELS value would swallow the next property's name in the generated call.
  set(props ${A_PROPERTIES})
  if(A_LABELS)
    list(PREPEND props LABELS "${A_LABELS}")
  endif()
  if(props)
    gtest_discover_tests(${A_NAME} DISCOVERY_TIMEOUT 30 TEST_PREFIX "${A_TEST_PREFIX}"
                         PROPERTIES ${props})
  else()
    gtest_discover_tests(${A_NAME} DISCOVERY_TIMEOUT 30 TEST_PREFIX "${A_TEST_PREFIX}")
  endif()
endfunction()
