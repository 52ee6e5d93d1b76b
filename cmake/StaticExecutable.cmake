# ctrun and ctrund link gRPC, protobuf and Abseil statically when Debian's
# archives are there, and the C++ runtime too: resolving the symbols of
# some sixty shared libraries took half of a launch's own time (perf: the
# dynamic loader's do_lookup_x), their pages counted in the agent's memory,
# and binaries that need nothing but glibc run from the wheel on any Linux
# with glibc 2.34 or newer (scripts/build-wheel.sh; scripts/check-binaries.sh
# keeps it so). Sanitized builds keep the shared libraries.
option(CTRUN_STATIC_EXECUTABLES
  "Link ctrun and ctrund against static gRPC, Abseil and libstdc++" ON)
find_package(PkgConfig)
if(PkgConfig_FOUND)
  pkg_check_modules(CTRUN_GRPC_STATIC grpc++ protobuf)
endif()
find_library(CTRUN_GRPCXX_ARCHIVE libgrpc++.a)
if(CTRUN_STATIC_EXECUTABLES AND CTRUN_GRPC_STATIC_FOUND
   AND CTRUN_GRPCXX_ARCHIVE AND NOT CTRUN_SANITIZE)
  set(CTRUN_LINK_STATIC ON)
  message(STATUS "ctrun: executables linked statically but for glibc")
else()
  set(CTRUN_LINK_STATIC OFF)
endif()

# ctrun_*: every archive of ours that `target` links, however indirectly.
function(ctrun_archive_closure target out)
  set(seen "")
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue t)
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(direct ${t} LINK_LIBRARIES)
    get_target_property(interface ${t} INTERFACE_LINK_LIBRARIES)
    foreach(lib IN LISTS direct interface)
      if(TARGET ${lib} AND lib MATCHES "^ctrun_")
        get_target_property(type ${lib} TYPE)
        if(type STREQUAL "STATIC_LIBRARY")
          list(APPEND queue ${lib})
        endif()
      endif()
    endforeach()
  endwhile()
  list(REMOVE_ITEM seen ${target})
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

# An executable `name` from `source`, linking `libs` (our targets and
# header-only ones): statically but for glibc where CTRUN_LINK_STATIC.
function(ctrun_add_executable name source)
  set(libs ${ARGN})
  if(NOT CTRUN_LINK_STATIC)
    add_executable(${name} ${source})
    target_link_libraries(${name} PRIVATE ${libs})
    return()
  endif()
  # main's object, compiled with the usual usage requirements...
  add_library(${name}_main OBJECT ${source}
    ${PROJECT_SOURCE_DIR}/packaging/glibc_floor.cc)
  target_link_libraries(${name}_main PRIVATE ${libs})
  # ...linked against our archives and the static libraries pkg-config
  # names, but for the system's own (libc, libdl, pthread, libstdc++).
  set(static_deps "")
  foreach(lib ${CTRUN_GRPC_STATIC_STATIC_LIBRARIES})
    if(NOT lib MATCHES "^(dl|pthread|atomic|m|rt|c|stdc\\+\\+)$")
      list(APPEND static_deps "-l${lib}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES static_deps)
  add_executable(${name} $<TARGET_OBJECTS:${name}_main>)
  # Our archives, from main's link closure: a new target needs no line here.
  ctrun_archive_closure(${name}_main ours)
  add_dependencies(${name} ${ours})
  set(archives "")
  foreach(lib ${ours})
    list(APPEND archives "$<TARGET_FILE:${lib}>")
  endforeach()
  target_link_options(${name} PRIVATE -Wl,--gc-sections -Wl,--as-needed
    -static-libstdc++ -static-libgcc)
  target_link_libraries(${name} PRIVATE
    -Wl,--start-group ${archives} -Wl,-Bstatic ${static_deps} atomic
    -Wl,-Bdynamic -Wl,--end-group
    ${CMAKE_DL_LIBS} Threads::Threads)
endfunction()
