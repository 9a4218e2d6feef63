#!/usr/bin/env node
// Runs ONNX models in ONNX Runtime (onnxruntime-node, CPU) for seqpack's tests
// and benchmarks. One process serves many runs, so a test grid pays Node's and
// ONNX Runtime's start-up once.
//
//   node tools/ort/run_ort.js REQUEST.json > RESULT.json
//
// REQUEST: {"threads": 1,                       (intra-op threads, default 1)
//           "runs": [{"model": "a.onnx",
//                     "inputs": {"x": {"type": "float32", "dims": [5, 2, 3], "data": [...]},
//                                "lengths": {"type": "int64", "dims": [2], "data": [5, 3]}},
//                     "outputs": ["y", "h_n"],   (optional: default every output)
//                     "repeat": 1}]}             (optional: timed runs after the first)
// RESULT:  {"ort_version": "...",
//           "results": [{"outputs": {"y": {"type": "float32", "dims": [...], "data": [...]}},
//                        "seconds": [...],            (wall time of each repeated run)
//                        "cpu_seconds": [...]}        (CPU time of the process during it)
//                       or {"error": "message"}]}     (a run ONNX Runtime rejected)
// An error of one run does not stop the others: tests check that a model is rejected.
'use strict';
const fs = require('fs');
const path = require('path');

function loadOrt() {
  const local = path.join(__dirname, 'node_modules', 'onnxruntime-node');
  try {
    return require(local);
  } catch (e) {
    process.stderr.write(`run_ort.js: cannot load ${local} (run scripts/setup.sh, which does ` +
                         `npm ci --ignore-scripts in tools/ort): ${e.message}\n`);
    process.exit(3);
  }
}

const kTypedArrays = {
  float32: Float32Array,
  float64: Float64Array,
  int32: Int32Array,
  int64: BigInt64Array,
  bool: Uint8Array,
};

function toTensor(ort, name, spec) {
  const Ctor = kTypedArrays[spec.type];
  if (!Ctor) throw new Error(`input '${name}': unsupported type '${spec.type}'`);
  const count = spec.dims.reduce((a, b) => a * b, 1);
  if (spec.data.length !== count) {
    throw new Error(`input '${name}': ${spec.data.length} values for dims [${spec.dims}]`);
  }
  const data = spec.type === 'int64' ? BigInt64Array.from(spec.data, (v) => BigInt(v))
                                     : Ctor.from(spec.data);
  return new ort.Tensor(spec.type, data, spec.dims);
}

function fromTensor(t) {
  const data = t.type === 'int64' ? Array.from(t.data, (v) => Number(v)) : Array.from(t.data);
  return {type: t.type, dims: Array.from(t.dims), data};
}

async function main() {
  if (process.argv.length !== 3) {
    process.stderr.write('usage: node run_ort.js REQUEST.json\n');
    process.exit(2);
  }
  const ort = loadOrt();
  const request = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const threads = request.threads || 1;
  const sessions = new Map();
  const results = [];
  for (const run of request.runs) {
    try {
      let session = sessions.get(run.model);
      if (!session) {
        session = await ort.InferenceSession.create(run.model, {
          intraOpNumThreads: threads,
          interOpNumThreads: 1,
          executionProviders: ['cpu'],
        });
        sessions.set(run.model, session);
      }
      const feeds = {};
      for (const [name, spec] of Object.entries(run.inputs)) {
        feeds[name] = toTensor(ort, name, spec);
      }
      const out = await session.run(feeds);
      const seconds = [];
      const cpuSeconds = [];
      for (let i = 0; i < (run.repeat || 0); ++i) {
        const c0 = process.cpuUsage();
        const t0 = process.hrtime.bigint();
        await session.run(feeds);
        seconds.push(Number(process.hrtime.bigint() - t0) * 1e-9);
        const c = process.cpuUsage(c0);
        cpuSeconds.push((c.user + c.system) * 1e-6);
      }
      const wanted = run.outputs || session.outputNames;
      const outputs = {};
      for (const name of wanted) outputs[name] = fromTensor(out[name]);
      results.push({outputs, seconds, cpu_seconds: cpuSeconds});
    } catch (e) {
      results.push({error: String(e.message || e)});
    }
  }
  process.stdout.write(JSON.stringify({ort_version: require(path.join(__dirname, 'node_modules',
                                                  'onnxruntime-node', 'package.json')).version,
                                       results}));
}

main().catch((e) => {
  process.stderr.write(`run_ort.js: ${e.stack || e}\n`);
  process.exit(1);
});
