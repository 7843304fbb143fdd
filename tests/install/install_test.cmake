# Installs the build tree into a scratch prefix, then configures, builds and runs a consumer project
# that uses find_package(flexcp), and runs the installed tool (which must find the installed
# library by its own RUNPATH, with no environment set). Run by ctest with -DBUILD_DIR, -DSOURCE_DIR,
# -DWORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/build -G Ninja
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${WORK_DIR}/build/consumer)
include(GNUInstallDirs)
step(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${WORK_DIR}/prefix/${CMAKE_INSTALL_BINDIR}/flexcp
     mask --mask causal --seqlen 64 --out ${WORK_DIR}/m.json)
if(NOT EXISTS ${WORK_DIR}/m.json)
  message(FATAL_ERROR "the installed flexcp ran but wrote no ${WORK_DIR}/m.json")
endif()
message("install test: the consumer and the installed tool ran: ok")
