# FindDNNL: oneDNN (Debian's libdnnl-dev; 2.x and 3.x) as the imported target
# DNNL::dnnl, the name oneDNN's own dnnl-config.cmake gives it. Found by hand
# rather than through that file, since Debian 12's (oneDNN 2.6, built with its
# OpenCL GPU runtime) requires OpenCL, which seqpack does not use. Used by the
# build and, installed beside seqpackConfig.cmake, by find_dependency(DNNL)
# there, so an installed seqpack names no library path of the build machine.
# An existing DNNL::dnnl (the consumer ran find_package(dnnl) first) is kept.
if(TARGET DNNL::dnnl)
  set(DNNL_FOUND TRUE)
  return()
endif()
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY dnnl)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DNNL REQUIRED_VARS DNNL_LIBRARY DNNL_INCLUDE_DIR)
if(DNNL_FOUND)
  add_library(DNNL::dnnl UNKNOWN IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES
    IMPORTED_LOCATION "${DNNL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${DNNL_INCLUDE_DIR}")
endif()
mark_as_advanced(DNNL_INCLUDE_DIR DNNL_LIBRARY)
