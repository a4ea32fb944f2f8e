# Reads a header for the line-based checks (check_device_discipline.cmake,
# check_no_serial_launch.cmake): `lines_var` gets one list element per line, with what
# CMake lists treat specially protected (\ ; [ ] as <BS> <SC> <LB> <RB>), and `code_var`
# the code of each line: comment lines blank, string literals emptied, trailing //
# comments stripped. Both lists are empty for an empty file.
function(commpact_header_lines file lines_var code_var)
  file(READ "${file}" content)
  commpact_protect(content)
  string(REPLACE "\r" "" content "${content}")
  string(REPLACE "\n" ";" lines "${content}")
  set(code "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^[ \t]*//")
      list(APPEND code " ")
    else()
      string(REGEX REPLACE "\"[^\"]*\"" "\"\"" c "${line}")
      string(REGEX REPLACE "//.*$" "" c "${c}")
      list(APPEND code "${c} ")
    endif()
  endforeach()
  set(${lines_var} "${lines}" PARENT_SCOPE)
  set(${code_var} "${code}" PARENT_SCOPE)
endfunction()

# Replaces what CMake lists treat specially in variable `var` by the markers above.
macro(commpact_protect var)
  string(REPLACE "\\" "<BS>" ${var} "${${var}}")
  string(REPLACE ";" "<SC>" ${var} "${${var}}")
  string(REPLACE "[" "<LB>" ${var} "${${var}}")
  string(REPLACE "]" "<RB>" ${var} "${${var}}")
endmacro()

# The reverse of commpact_protect, for messages (a ; comes back escaped, as \;).
macro(commpact_unprotect var)
  string(REPLACE "<BS>" "\\" ${var} "${${var}}")
  string(REPLACE "<SC>" "\;" ${var} "${${var}}")
  string(REPLACE "<LB>" "[" ${var} "${${var}}")
  string(REPLACE "<RB>" "]" ${var} "${${var}}")
endmacro()
