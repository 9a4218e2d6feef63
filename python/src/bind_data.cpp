// The length-bucketing samplers and padding statistics (include/seqpack/data.h),
// used by seqpack.data.BucketBatchSampler and DistributedBucketBatchSampler.
#include <pybind11/stl.h>

#include "bind.h"
#include "seqpack/data.h"
#include "tensor_caster.h"

namespace seqpack::python {

void bind_data(py::module_& m) {
  py::class_<BucketingOptions>(m, "BucketingOptions")
      .def(py::init([](int64_t batch_size, int64_t max_tokens, uint64_t seed, int64_t pool_batches,
                       bool drop_last, bool shuffle) {
             return BucketingOptions{batch_size,   max_tokens, seed,
                                     pool_batches, drop_last,  shuffle};
           }),
           py::arg("batch_size"), py::arg("max_tokens"), py::arg("seed"), py::arg("pool_batches"),
           py::arg("drop_last"), py::arg("shuffle"))
      .def_readonly("batch_size", &BucketingOptions::batch_size)
      .def_readonly("max_tokens", &BucketingOptions::max_tokens)
      .def_readonly("seed", &BucketingOptions::seed)
      .def_readonly("pool_batches", &BucketingOptions::pool_batches)
      .def_readonly("drop_last", &BucketingOptions::drop_last)
      .def_readonly("shuffle", &BucketingOptions::shuffle);

  py::class_<BucketingSampler>(m, "BucketingSampler")
      .def(py::init<std::vector<int64_t>, BucketingOptions>(), py::arg("lengths"),
           py::arg("options"))
      .def("epoch", &BucketingSampler::epoch, py::arg("epoch"))
      .def("num_batches", &BucketingSampler::num_batches, py::arg("epoch"))
      .def_property_readonly("size", &BucketingSampler::size)
      .def_property_readonly("options", &BucketingSampler::options);

  py::class_<DistributedBucketingSampler>(m, "DistributedBucketingSampler")
      .def(py::init<std::vector<int64_t>, BucketingOptions, int64_t, int64_t>(), py::arg("lengths"),
           py::arg("options"), py::arg("num_replicas"), py::arg("rank"))
      .def("epoch", &DistributedBucketingSampler::epoch, py::arg("epoch"))
      .def("all_ranks", &DistributedBucketingSampler::all_ranks, py::arg("epoch"))
      .def_property_readonly("num_replicas", &DistributedBucketingSampler::num_replicas)
      .def_property_readonly("rank", &DistributedBucketingSampler::rank)
      .def_property_readonly("sampler", &DistributedBucketingSampler::sampler,
                             py::return_value_policy::reference_internal);

  py::class_<PaddingStats>(m, "PaddingStats")
      .def_readonly("real_tokens", &PaddingStats::real_tokens)
      .def_readonly("padded_slots", &PaddingStats::padded_slots)
      .def_property_readonly("efficiency", &PaddingStats::efficiency);
  py::class_<PaddingReport>(m, "PaddingReport")
      .def_readonly("random", &PaddingReport::random)
      .def_readonly("bucketed", &PaddingReport::bucketed)
      .def_readonly("packed", &PaddingReport::packed)
      .def_readonly("num_batches", &PaddingReport::num_batches);
  m.def("padding_report", &padding_report, py::arg("sampler"), py::arg("epoch"));
  m.def("batch_tokens", &batch_tokens, py::arg("lengths"), py::arg("batches"));
}

}  // namespace seqpack::python
