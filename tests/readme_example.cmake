# Extracts the C++ example of README.md ("## C++ in five lines": its first
# ```cpp block) into a program: the block's first paragraph (#includes and
# using) at file scope, the rest as the body of main(). Run at build time by
# tests/CMakeLists.txt whenever README.md changes, so the test compiles what
# the README shows, never a copy that could drift.
#   cmake -DREADME=README.md -DOUT=readme_example.cpp -P readme_example.cmake
file(READ "${README}" text)
string(FIND "${text}" "## C++ in five lines" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${README}: no section '## C++ in five lines'")
endif()
string(SUBSTRING "${text}" ${at} -1 text)
string(FIND "${text}" "```cpp\n" start)
if(start EQUAL -1)
  message(FATAL_ERROR "${README}: no ```cpp block in '## C++ in five lines'")
endif()
math(EXPR start "${start} + 7")
string(SUBSTRING "${text}" ${start} -1 text)
string(FIND "${text}" "```" stop)
string(SUBSTRING "${text}" 0 ${stop} block)
string(FIND "${block}" "\n\n" split)
if(split EQUAL -1)
  message(FATAL_ERROR "${README}: the C++ example has no blank line between its #includes and its code")
endif()
string(SUBSTRING "${block}" 0 ${split} head)
math(EXPR split "${split} + 2")
string(SUBSTRING "${block}" ${split} -1 body)
file(WRITE "${OUT}" "// Generated from ${README} by tests/readme_example.cmake: do not edit.\n"
                    "${head}\n\nint main() {\n${body}return 0;\n}\n")
