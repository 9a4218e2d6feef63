// seqpack_torch_version() (seqpack_torch/include/seqpack/torch.h): a symbol of
// libseqpack_torch that programs can reference, so that the linker keeps the
// library (whose operators register themselves when it loads) even under
// --as-needed; seqpack::torch asks for it with -u.
#include "seqpack/torch.h"

#include "seqpack/version.h"

extern "C" const char* seqpack_torch_version(void) { return SEQPACK_VERSION_STRING; }
