// `seqpack info`: what this machine offers seqpack: the ISA oneDNN dispatches
// to (capped by ONEDNN_MAX_CPU_ISA), native bf16 and int8, AMX, the precision `auto`
// picks, the thread count and the library versions (seqpack's own first). --json for scripts.
#include <fmt/core.h>
#include <omp.h>

#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "seqpack/policy.h"
#include "seqpack/precision.h"
#include "seqpack/threading.h"
#include "seqpack/version.h"

namespace seqpack::cli {
namespace {

struct Args {
  bool json = false;
  int threads = 0;
};

void run_info(const Args& args) {
  const std::string placement = place_threads(args.threads);
  if (args.threads > 0) set_num_threads(args.threads);
  const CpuInfo cpu = cpu_info(tool_policy());
  const Precision autop = resolve_precision("auto", kernel_config(tool_policy()));
  if (args.json) {
    nlohmann::ordered_json j = {{"seqpack", version()},
                                {"isa", cpu.isa},
                                {"kernels", cpu.kernels},
                                {"isa_cap", cpu.isa_cap},
                                {"native_bf16", cpu.native_bf16},
                                {"bf16", cpu.bf16},
                                {"native_int8", cpu.native_int8},
                                {"amx", cpu.amx},
                                {"int8_kernel", cpu.int8_kernel},
                                {"auto_precision", precision_name(autop)},
                                {"threads", cpu.threads},
                                {"threads_bound", omp_get_proc_bind() != omp_proc_bind_false},
                                {"thread_placement", placement},
                                {"onednn", cpu.onednn_version},
                                {"blas", cpu.blas}};
    // Strings from the environment may be any bytes: never a type error here.
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    return;
  }
  fmt::print("seqpack          {}\n", version());
  fmt::print("ISA (oneDNN)     {}\n", cpu.isa);
  fmt::print("kernels          {} (Highway; SEQPACK_MAX_CPU_ISA cap: {})\n", cpu.kernels,
             cpu.isa_cap);
  fmt::print("native bf16      {}{}\n", cpu.native_bf16 ? "yes" : "no",
             cpu.bf16 == "emulated" ? " (--precision bf16 runs emulated: SEQPACK_BF16)" : "");
  const std::string int8_kernel = cpu.int8_kernel == "amx"    ? "AMX-INT8"
                                  : cpu.int8_kernel == "vnni" ? "AVX512-VNNI"
                                  : cpu.int8_kernel == "avx2" ? "AVX2, 7-bit rows"
                                                              : "scalar, 7-bit rows";
  fmt::print("native int8      {} (--precision int8 for inference runs on {})\n",
             cpu.native_int8 ? "yes" : "no", int8_kernel);
  fmt::print("AMX              {}\n", cpu.amx ? "yes" : "no");
  fmt::print("precision auto   {}\n", precision_name(autop));
  fmt::print("threads          {} ({})\n", cpu.threads, placement);
  fmt::print("oneDNN           {}\n", cpu.onednn_version);
  fmt::print("BLAS             {}\n", cpu.blas);
}

void setup(CLI::App& sub) {
  auto args = std::make_shared<Args>();
  sub.add_flag("--json", args->json, "one JSON object instead of a table");
  add_number(sub, "--threads", args->threads, "report for this many threads (0: OpenMP's)", 0, 1024);
  sub.callback([args] { run_info(*args); });
}

[[maybe_unused]] const bool registered = register_command(
    {"info", "the CPU's ISA, bf16 support, threads and library versions", setup});

}  // namespace
}  // namespace seqpack::cli
