// Rows a gate kernel side-writes for the next matrix product: next to each
// fp32 value it writes (h for the next step's product, dG for the backward's),
// the kernel also writes it in the form the engine's product reads, while the
// value is in a register, so the engine needs no conversion pass of its own.
//
// The engine names that form (GemmEngine::product_form and step_form,
// cpu/gemm_engine.h), the time loop keeps the rows in it (cpu/operand_rows.h)
// and hands each kernel the sink's rows it writes, and the gate kernels are
// instantiated per form (cpu/rnn_gates.h): a new operand form (int8 with a
// scale per row) adds a SinkElement, its conversion in OperandRows, an
// engine and kernel instantiations, and changes no signature the loop sees.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>

namespace seqpack::cpu {

// The element of a sink's rows.
enum class SinkElement : uint8_t {
  none,  // no sink: the engine reads the fp32 rows (or converts them itself)
  bf16,  // bf16 bits (uint16_t), fp32 rounded to nearest even (cpu/bf16.h bf16_of)
};

inline constexpr std::size_t sink_element_bytes(SinkElement e) {
  return e == SinkElement::bf16 ? sizeof(uint16_t) : 0;
}

// Row r of the sink's matrix starts at data + r * ld elements. `scale`, for
// forms quantized with one scale per row, holds row r's at scale[r] (null for
// bf16). Empty (data null) where the engine keeps no rows in another form.
struct RowSink {
  SinkElement element = SinkElement::none;
  void* data = nullptr;
  int64_t ld = 0;          // row stride, in elements
  float* scale = nullptr;  // one per row, for the forms that have one

  static RowSink bf16(uint16_t* rows, int64_t ld) { return {SinkElement::bf16, rows, ld, nullptr}; }

  explicit operator bool() const { return data != nullptr; }

  // The sink from row r on: what a kernel writing rows r.. is handed (its row
  // 0 is row r). Empty stays empty.
  RowSink from_row(int64_t r) const {
    if (!data) return {};
    return {element, static_cast<char*>(data) + r * ld * sink_element_bytes(element), ld,
            scale ? scale + r : nullptr};
  }

  // Row r's bf16 bits (a bf16 sink), or null (empty).
  uint16_t* bf16_row(int64_t r) const {
    assert(!data || element == SinkElement::bf16);
    return data ? static_cast<uint16_t*>(data) + r * ld : nullptr;
  }
};

}  // namespace seqpack::cpu
