// live_serving_check: a C++ runtime that serves a tensorflow_ext SavedModel without Python, as TF Serving would.
//
//   live_serving_check --saved_model DIR --op_library linked|PATH --ids 1,2,3 [--ids_shape 3,1]
//                      [--input KEY] [--tags serve] [--signature serving_default] [--update DIR]... --out JSON
//
// It loads the SavedModel with tensorflow::LoadSavedModel (the C++ loader TF Serving uses), runs the predict
// signature on the given int64 ids, then for each --update, in order, runs the export's `tf_ext_apply_update`
// signature on that update directory and predicts again. After each prediction it reads `tf_ext_served_version`
// (when the export has it). The JSON written to --out:
//
//   {"tensorflow": "2.15.1", "saved_model": DIR, "ops": "linked" | PATH,
//    "steps": [{"update": null | DIR, "version": v | null, "applied": bool | null, "served_version": v | null,
//               "outputs": {KEY: {"dtype": "float32", "shape": [..], "values": [.. flattened, row-major ..]}}}]}
//
// step 0 is the prediction before any update ("update", "version" and "applied" null); float values are written
// with enough digits to read back the same float (NaN and infinities as the strings "NaN", "Infinity",
// "-Infinity").
//
// The ops: the `live_serving_check` target links tensorflow_ext's kernel libraries into the program (what a TF
// Serving build with the ops does: there is no op library to load) and takes `--op_library linked`;
// `live_serving_check_dlopen` links none and loads the op library given as `--op_library PATH` with TF_LoadLibrary
// (what any C++ runtime can do with the wheel's _tf_ext_ops.so). Each refuses the other's form.
//
// Errors (a bad argument, a SavedModel that does not load, a refused update) print one line naming the problem to
// stderr and exit nonzero (2: usage, 1: anything else) without writing --out: a caller never reads a partial run.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "tensorflow/c/c_api.h"
#include "tensorflow/cc/saved_model/loader.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/protobuf/config.pb.h"
#include "tensorflow/core/protobuf/meta_graph.pb.h"
#include "tensorflow/core/public/session.h"

namespace {

using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// The signature names and keys the export's live rewrite adds (tensorflow_ext/serving/live.py).
constexpr char kApplySignature[] = "tf_ext_apply_update";
constexpr char kApplyInput[] = "update_dir";
constexpr char kApplyVersion[] = "version";
constexpr char kApplyApplied[] = "applied";
constexpr char kVersionSignature[] = "tf_ext_served_version";
constexpr char kVersionOutput[] = "version";
// An op every tensorflow_ext op library registers: present means the ops are in this process.
constexpr char kProbeOp[] = "TfExtFrozenTableFind";
constexpr char kLinked[] = "linked";

struct Args {
  std::string saved_model;
  std::string op_library;
  std::string ids;
  std::string ids_shape;
  std::string input;
  std::string tags = "serve";
  std::string signature = "serving_default";
  std::vector<std::string> updates;
  std::string out;
};

// Thrown for any failure; main prints it and exits with `code`.
struct Failure {
  int code;
  std::string message;
};

[[noreturn]] void Fail(int code, const std::string& message) { throw Failure{code, message}; }

void Check(const Status& status, const std::string& what) {
  if (!status.ok()) Fail(1, what + ": " + status.ToString());
}

const char kUsage[] =
    "usage: live_serving_check --saved_model DIR --op_library linked|PATH --ids 1,2,3 [--ids_shape 3,1]\n"
    "                          [--input KEY] [--tags serve] [--signature serving_default] [--update DIR]...\n"
    "                          --out JSON\n";

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) Fail(2, "flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--saved_model") {
      args.saved_model = value;
    } else if (flag == "--op_library") {
      args.op_library = value;
    } else if (flag == "--ids") {
      args.ids = value;
    } else if (flag == "--ids_shape") {
      args.ids_shape = value;
    } else if (flag == "--input") {
      args.input = value;
    } else if (flag == "--tags") {
      args.tags = value;
    } else if (flag == "--signature") {
      args.signature = value;
    } else if (flag == "--update") {
      args.updates.push_back(value);
    } else if (flag == "--out") {
      args.out = value;
    } else {
      Fail(2, "unknown flag " + flag);
    }
  }
  if (args.saved_model.empty()) Fail(2, "--saved_model is required");
  if (args.op_library.empty()) Fail(2, "--op_library is required (\"linked\" or the op library's path)");
  if (args.ids.empty()) Fail(2, "--ids is required");
  if (args.out.empty()) Fail(2, "--out is required");
  return args;
}

// "1,-2,3" -> {1, -2, 3}; `what` names the flag in errors.
std::vector<int64_t> ParseInts(const std::string& text, const std::string& what) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE) Fail(2, what + ": not an int64 list: '" + text + "'");
    values.push_back(v);
  }
  return values;
}

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, sep)) parts.push_back(item);
  return parts;
}

bool OpsRegistered() {
  const tensorflow::OpRegistrationData* data = nullptr;
  return tensorflow::OpRegistry::Global()->LookUp(kProbeOp, &data).ok();
}

// Makes the tensorflow_ext ops available as --op_library says, or fails naming why.
void LoadOps(const std::string& op_library) {
  const bool linked = OpsRegistered();
  if (op_library == kLinked) {
    if (!linked) {
      Fail(2,
           "--op_library linked: this program does not link the tensorflow_ext ops (it is "
           "live_serving_check_dlopen): pass the op library's path");
    }
    return;
  }
  if (linked) {
    Fail(2, "--op_library " + op_library +
                ": this program links the tensorflow_ext ops already; pass --op_library linked (loading the library "
                "too would register every op twice)");
  }
  TF_Status* status = TF_NewStatus();
  TF_Library* library = TF_LoadLibrary(op_library.c_str(), status);
  const std::string message = TF_Message(status);
  const bool ok = TF_GetCode(status) == TF_OK;
  TF_DeleteStatus(status);
  if (!ok) Fail(1, "cannot load the op library " + op_library + ": " + message);
  // The library stays loaded for the life of the process (its kernels are registered); only the handle goes.
  TF_DeleteLibraryHandle(library);
  if (!OpsRegistered()) Fail(1, "the library " + op_library + " loaded but does not register " + kProbeOp);
}

const tensorflow::SignatureDef* FindSignature(const tensorflow::MetaGraphDef& meta, const std::string& name) {
  auto it = meta.signature_def().find(name);
  return it == meta.signature_def().end() ? nullptr : &it->second;
}

const tensorflow::TensorInfo& SignatureTensor(const google::protobuf::Map<std::string, tensorflow::TensorInfo>& map,
                                              const std::string& signature, const std::string& key, const char* side) {
  auto it = map.find(key);
  if (it == map.end()) Fail(1, "signature '" + signature + "' has no " + side + " '" + key + "'");
  return it->second;
}

// ---------------------------------------------------------------- JSON

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// `digits` significant digits read back to the same value: 9 for float32, 17 for float64.
std::string JsonFloat(double v, int digits) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  return buf;
}

std::string JsonTensor(const Tensor& t, const std::string& key) {
  std::string values;
  const int64_t n = t.NumElements();
  for (int64_t i = 0; i < n; ++i) {
    if (i) values += ",";
    switch (t.dtype()) {
      case tensorflow::DT_FLOAT:
        values += JsonFloat(t.flat<float>()(i), 9);
        break;
      case tensorflow::DT_DOUBLE:
        values += JsonFloat(t.flat<double>()(i), 17);
        break;
      case tensorflow::DT_INT32:
        values += std::to_string(t.flat<int32_t>()(i));
        break;
      case tensorflow::DT_INT64:
        values += std::to_string(t.flat<int64_t>()(i));
        break;
      case tensorflow::DT_BOOL:
        values += t.flat<bool>()(i) ? "true" : "false";
        break;
      case tensorflow::DT_STRING:
        values += JsonString(std::string(t.flat<tensorflow::tstring>()(i)));
        break;
      default:
        Fail(1, "output '" + key + "' has dtype " + tensorflow::DataTypeString(t.dtype()) +
                    ", which this program does not print (float32, float64, int32, int64, bool, string)");
    }
  }
  std::string shape;
  for (int d = 0; d < t.dims(); ++d) shape += (d ? "," : "") + std::to_string(t.dim_size(d));
  std::string dtype = tensorflow::DataTypeString(t.dtype());
  if (dtype == "float") dtype = "float32";
  if (dtype == "double") dtype = "float64";
  return "{\"dtype\": " + JsonString(dtype) + ", \"shape\": [" + shape + "], \"values\": [" + values + "]}";
}

// ---------------------------------------------------------------- serving

class Server {
 public:
  explicit Server(const Args& args) : args_(args) {
    tensorflow::SessionOptions options;
    tensorflow::RunOptions run_options;
    const std::vector<std::string> tags = Split(args.tags, ',');
    Check(tensorflow::LoadSavedModel(options, run_options, args.saved_model,
                                     std::unordered_set<std::string>(tags.begin(), tags.end()), &bundle_),
          "cannot load the SavedModel " + args.saved_model + " (tags " + args.tags + ")");
    const tensorflow::MetaGraphDef& meta = bundle_.meta_graph_def;
    predict_ = FindSignature(meta, args.signature);
    if (predict_ == nullptr)
      Fail(1, "the SavedModel " + args.saved_model + " has no signature '" + args.signature + "'");
    apply_ = FindSignature(meta, kApplySignature);
    version_ = FindSignature(meta, kVersionSignature);

    std::string input = args.input;
    if (input.empty()) {
      if (predict_->inputs_size() != 1) {
        Fail(2, "signature '" + args.signature + "' has " + std::to_string(predict_->inputs_size()) +
                    " inputs: name the ids' with --input");
      }
      input = predict_->inputs().begin()->first;
    }
    const tensorflow::TensorInfo& info = SignatureTensor(predict_->inputs(), args.signature, input, "input");
    input_name_ = info.name();
    const std::vector<int64_t> ids = ParseInts(args.ids, "--ids");
    std::vector<int64_t> dims = args.ids_shape.empty() ? std::vector<int64_t>{static_cast<int64_t>(ids.size())}
                                                       : ParseInts(args.ids_shape, "--ids_shape");
    TensorShape shape;
    for (int64_t d : dims) {
      if (d < 0) Fail(2, "--ids_shape: negative dimension in '" + args.ids_shape + "'");
      shape.AddDim(d);
    }
    if (shape.num_elements() != static_cast<int64_t>(ids.size())) {
      Fail(2, "--ids_shape " + args.ids_shape + " holds " + std::to_string(shape.num_elements()) + " ids, --ids has " +
                  std::to_string(ids.size()));
    }
    // The ids as the signature's input dtype (int64, or int32 for models that take int32 ids).
    if (info.dtype() == tensorflow::DT_INT64) {
      ids_ = Tensor(tensorflow::DT_INT64, shape);
      for (size_t i = 0; i < ids.size(); ++i) ids_.flat<int64_t>()(i) = ids[i];
    } else if (info.dtype() == tensorflow::DT_INT32) {
      ids_ = Tensor(tensorflow::DT_INT32, shape);
      for (size_t i = 0; i < ids.size(); ++i) ids_.flat<int32_t>()(i) = static_cast<int32_t>(ids[i]);
    } else {
      Fail(1, "signature input '" + input + "' has dtype " + tensorflow::DataTypeString(info.dtype()) +
                  ": this program feeds int64 or int32 ids");
    }
  }

  // {"KEY": tensor JSON, ...} of the predict signature's outputs on the ids, keys sorted.
  std::string Predict() {
    std::vector<std::string> keys, names;
    for (const auto& kv : predict_->outputs()) keys.push_back(kv.first);
    std::sort(keys.begin(), keys.end());
    for (const std::string& key : keys) names.push_back(predict_->outputs().at(key).name());
    std::vector<Tensor> outputs;
    Check(bundle_.session->Run({{input_name_, ids_}}, names, {}, &outputs),
          "running signature '" + args_.signature + "'");
    std::string json = "{";
    for (size_t i = 0; i < keys.size(); ++i) {
      json += (i ? ", " : "") + JsonString(keys[i]) + ": " + JsonTensor(outputs[i], keys[i]);
    }
    return json + "}";
  }

  // The served version as JSON ("null" when the export is not live).
  std::string ServedVersion() {
    if (version_ == nullptr) return "null";
    const std::string name = SignatureTensor(version_->outputs(), kVersionSignature, kVersionOutput, "output").name();
    std::vector<Tensor> outputs;
    Check(bundle_.session->Run({}, {name}, {}, &outputs), std::string("running signature '") + kVersionSignature + "'");
    return std::to_string(outputs[0].scalar<int64_t>()());
  }

  // Applies one update; returns its JSON fields "version": v, "applied": b.
  std::string Apply(const std::string& update_dir) {
    if (apply_ == nullptr) {
      Fail(1, "update " + update_dir + ": the SavedModel " + args_.saved_model + " has no '" + kApplySignature +
                  "' signature (export it inside tf_ext.serving.freeze_for_serving(live_model=...) to make it "
                  "updatable)");
    }
    Tensor dir(tensorflow::DT_STRING, TensorShape({}));
    dir.scalar<tensorflow::tstring>()() = update_dir;
    const std::string feed = SignatureTensor(apply_->inputs(), kApplySignature, kApplyInput, "input").name();
    const std::string version = SignatureTensor(apply_->outputs(), kApplySignature, kApplyVersion, "output").name();
    const std::string applied = SignatureTensor(apply_->outputs(), kApplySignature, kApplyApplied, "output").name();
    std::vector<Tensor> outputs;
    Check(bundle_.session->Run({{feed, dir}}, {version, applied}, {}, &outputs), "update " + update_dir);
    return "\"version\": " + std::to_string(outputs[0].scalar<int64_t>()()) +
           ", \"applied\": " + (outputs[1].scalar<bool>()() ? "true" : "false");
  }

 private:
  const Args& args_;
  tensorflow::SavedModelBundle bundle_;
  const tensorflow::SignatureDef* predict_ = nullptr;
  const tensorflow::SignatureDef* apply_ = nullptr;
  const tensorflow::SignatureDef* version_ = nullptr;
  std::string input_name_;
  Tensor ids_;
};

void Run(const Args& args) {
  LoadOps(args.op_library);
  Server server(args);
  std::vector<std::string> steps;
  steps.push_back("{\"update\": null, \"version\": null, \"applied\": null, \"served_version\": " +
                  server.ServedVersion() + ", \"outputs\": " + server.Predict() + "}");
  for (const std::string& update : args.updates) {
    const std::string result = server.Apply(update);
    steps.push_back("{\"update\": " + JsonString(update) + ", " + result +
                    ", \"served_version\": " + server.ServedVersion() + ", \"outputs\": " + server.Predict() + "}");
  }
  std::string json = "{\"tensorflow\": " + JsonString(TF_Version()) +
                     ", \"saved_model\": " + JsonString(args.saved_model) +
                     ", \"ops\": " + JsonString(args.op_library) + ", \"steps\": [\n";
  for (size_t i = 0; i < steps.size(); ++i) json += (i ? ",\n " : " ") + steps[i];
  json += "\n]}\n";
  std::ofstream out(args.out);
  out << json;
  out.close();
  if (!out) Fail(1, "cannot write " + args.out);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Run(ParseArgs(argc, argv));
  } catch (const Failure& failure) {
    std::fprintf(stderr, "live_serving_check: %s\n", failure.message.c_str());
    if (failure.code == 2) std::fputs(kUsage, stderr);
    return failure.code;
  }
  return 0;
}
