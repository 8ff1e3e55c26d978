# knnd_layer(NAME SOURCES ... [DEPS ...] [PRIVATE_DEPS ...])
#
# One folder of src/ as its own static library, knnd_<NAME>. Its headers are
# included as "knnd/<NAME>/file.h" through an include root of its own
# (${CMAKE_BINARY_DIR}/layers/<NAME>, holding the link knnd/<NAME> ->
# src/<NAME>), which only the targets that link the layer see: a file that
# includes a header of a layer it does not link (a lower layer reaching up)
# fails to compile. DEPS are the layers (and libraries) below it, whose
# include roots it then sees; PRIVATE_DEPS are libraries only its own files
# use, whose headers do not reach the layers above (FAISS's, for src/faiss).
function(knnd_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  set(root ${CMAKE_BINARY_DIR}/layers/${name})
  file(MAKE_DIRECTORY ${root}/knnd)
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${root}/knnd/${name} SYMBOLIC)
  add_library(knnd_${name} STATIC ${L_SOURCES})
  target_include_directories(knnd_${name} PUBLIC ${root})
  target_link_libraries(knnd_${name} PUBLIC ${L_DEPS} PRIVATE ${L_PRIVATE_DEPS})
  add_dependencies(knnd_${name} knnd_layer_check)
endfunction()
