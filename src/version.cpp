// seqpack::version(): the version the library was compiled as (include/seqpack/version.h.in).
#include "seqpack/version.h"

namespace seqpack {

const char* version() noexcept { return SEQPACK_VERSION_STRING; }

}  // namespace seqpack
