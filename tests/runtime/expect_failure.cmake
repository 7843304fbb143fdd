# Runs COMMAND (a ;-list) and passes when it fails (non-zero exit) within MAX_SECONDS and its output
# matches EXPECT: a failed rank must end the job, not hang it.
string(TIMESTAMP start "%s")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP stop "%s")
math(EXPR elapsed "${stop} - ${start}")
message("exit: ${rc} after ${elapsed} s\n${out}\n${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the job succeeded although a rank failed")
endif()
if(rc MATCHES "timeout" OR elapsed GREATER_EQUAL ${MAX_SECONDS})
  message(FATAL_ERROR "the job hung: still running after ${MAX_SECONDS} s")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}'")
endif()
