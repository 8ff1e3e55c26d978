# Run at every build (target knnd_layer_check): the rules that include paths
# alone cannot enforce, because the headers in question are installed under
# /usr/include and so visible to every file.
#   - FAISS (<faiss/...>) is included only under src/faiss/.
#   - prometheus-cpp only under src/monitoring/.
#   - OpenMP (<omp.h>) and OpenBLAS only under src/faiss/.
#   - libmicrohttpd only in src/rpc/http_server.cc and http_connection.*,
#     GnuTLS only there and in src/rpc/http_tls.cc.
# A violation fails the build with the file and the line.
file(GLOB_RECURSE sources RELATIVE ${SOURCE_DIR}
  ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cc)
set(violations "")
foreach(f ${sources})
  file(STRINGS ${SOURCE_DIR}/${f} lines REGEX "^[ \t]*#[ \t]*include|openblas_")
  foreach(line ${lines})
    set(rule "")
    if(line MATCHES "[<\"]faiss/" AND NOT f MATCHES "^src/faiss/")
      set(rule "FAISS is included only in src/faiss/")
    elseif(line MATCHES "[<\"]prometheus/" AND NOT f MATCHES "^src/monitoring/")
      set(rule "prometheus-cpp is included only in src/monitoring/")
    elseif((line MATCHES "[<\"]omp\\.h" OR line MATCHES "openblas_")
           AND NOT f MATCHES "^src/faiss/")
      set(rule "OpenMP and OpenBLAS are set only in src/faiss/")
    elseif(line MATCHES "[<\"]microhttpd\\.h"
           AND NOT f MATCHES "^src/rpc/http_(server\\.cc|connection\\.)")
      set(rule "libmicrohttpd is included only in src/rpc/http_server.cc and http_connection.*")
    elseif(line MATCHES "[<\"]gnutls/"
           AND NOT f MATCHES "^src/rpc/http_(connection\\.|tls\\.cc)")
      set(rule "GnuTLS is included only in src/rpc/http_connection.* and http_tls.cc")
    endif()
    if(rule)
      string(STRIP "${line}" line)
      string(APPEND violations "  ${f}: ${line}  (${rule})\n")
    endif()
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR "layer rules broken:\n${violations}")
endif()
