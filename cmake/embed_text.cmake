# Turns a text file into a header holding it as a raw string literal, so that the binary needs
# no data file at runtime. Run as a build step (see src/runtime/ns/CMakeLists.txt):
#   cmake -DIN=<file> -DOUT=<header> -DNAME=<C++ identifier> -P embed_text.cmake
# The header is rewritten only when its content changes, so unrelated builds stay incremental.
file(READ "${IN}" content)
set(delim "sbx_embed")
string(FIND "${content}" ")${delim}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "embed_text: ${IN} contains the raw string delimiter )${delim}\"")
endif()
set(text "// Generated from ${IN} by cmake/embed_text.cmake: edit that file, not this one.\n#pragma once\n\ninline constexpr char ${NAME}[] = R\"${delim}(${content})${delim}\";\n")
file(WRITE "${OUT}.tmp" "${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
