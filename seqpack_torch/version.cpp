// seqpack_torch_version() (seqpack_torch/include/seqpack/torch.h): the version
// of seqpack that libseqpack_torch was built from, for LibTorch programs.
#include "seqpack/torch.h"

#include "seqpack/version.h"

extern "C" const char* seqpack_torch_version(void) { return SEQPACK_VERSION_STRING; }
