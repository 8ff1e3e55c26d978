# Writes the version header (src/build_version.h.in) with the commit checked
# out now. Run at every build by the knnd_build_version target, so that
# `knnd --version` and the build_info metric name the commit that was built,
# not the one of the last configure; configure_file leaves the header (and
# so build_info.cc's object) untouched when nothing changed.
#   cmake -DSOURCE_DIR=... -DOUTPUT=... -DPROJECT_VERSION=... -P build_version.cmake
execute_process(
  COMMAND git rev-parse --short=12 HEAD
  WORKING_DIRECTORY ${SOURCE_DIR}
  OUTPUT_VARIABLE KNND_GIT_COMMIT
  OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_QUIET)
if(NOT KNND_GIT_COMMIT)
  set(KNND_GIT_COMMIT "unknown")
endif()
configure_file(${SOURCE_DIR}/src/build_version.h.in ${OUTPUT} @ONLY)
