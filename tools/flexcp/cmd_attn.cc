// flexcp attn: attention on tensors saved as float32 .npy files (DESIGN §4).
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <tuple>

#include "cli_options.h"
#include "commands.h"
#include "flexcp/flexcp.h"
#include "host_tensor.h"
#include "npy.h"
#if defined(FLEXCP_TOOLS_CUDA)
#include "device_tensor.h"
#endif

namespace flexcp::tools {
namespace {

struct AttnArgs {
  MaskArgs mask;
  std::string q, k, v, out, lse, dout, dq, dk, dv, sink, dsink;
  std::string device = "cpu";
  std::string dtype = "fp32";
  double scale = 0.0;
  double softcap = 0.0;
  bool deterministic = false;
};

HostTensor load(const std::string& path, DType dtype, int ndim, const char* name) {
  NpyArray a = read_npy(path);
  if (static_cast<int>(a.shape.size()) != ndim)
    throw Error(Status::kInvalidArgument, std::string("--") + name + " " + path + " has " +
                                              std::to_string(a.shape.size()) + " dims, expected " +
                                              std::to_string(ndim));
  HostTensor t(dtype, a.shape);
  t.assign(a.data);
  return t;
}

void save(const std::string& path, const HostTensor& t) {
  write_npy(path, t.shape(), t.to_float().data());
}

// The gradients the backward writes (poisoned first, so that an element it skips shows).
struct Grads {
  HostTensor dq, dk, dv;
  std::optional<HostTensor> dsink;
  Grads(DType dtype, const HostTensor& q, const HostTensor& k, const HostTensor* sink)
      : dq(dtype, q.shape()), dk(dtype, k.shape()), dv(dtype, k.shape()) {
    if (sink) dsink.emplace(DType::kFloat32, sink->shape());
    for (HostTensor* t : {&dq, &dk, &dv}) t->poison();
    if (dsink) dsink->poison();
  }
};

// On the GPU: inputs and the poisoned outputs copied over, the forward (and with dout the
// backward) run there, outputs copied back.
void run_on_device(const HostTensor& q, const HostTensor& k, const HostTensor& v, const Mask& mask,
                   HostTensor& out, HostTensor& lse, const AttentionOptions& options,
                   const HostTensor* sink, const HostTensor* dout, Grads* grads) {
#if defined(FLEXCP_TOOLS_CUDA)
  const DeviceTensor dq(q), dk(k), dv(v), dout_(out), dlse(lse);
  // The sink goes to the device with the other inputs.
  std::optional<DeviceTensor> dsink;
  AttentionOptions on_device = options;
  if (sink) on_device.sink = dsink.emplace(*sink).view();
  forward(dq.view(), dk.view(), dv.view(), mask, dout_.view(), dlse.view(), on_device);
  dout_.copy_to(out);
  dlse.copy_to(lse);
  if (dout == nullptr) return;
  const DeviceTensor g(*dout), gq(grads->dq), gk(grads->dk), gv(grads->dv);
  std::optional<DeviceTensor> gsink;
  if (grads->dsink) gsink.emplace(*grads->dsink);
  backward(g.view(), dq.view(), dk.view(), dv.view(), dout_.view(), dlse.view(), mask, gq.view(),
           gk.view(), gv.view(), on_device, gsink ? gsink->view() : TensorView{});
  gq.copy_to(grads->dq);
  gk.copy_to(grads->dk);
  gv.copy_to(grads->dv);
  if (gsink) gsink->copy_to(*grads->dsink);
#else
  static_cast<void>(std::tie(q, k, v, mask, out, lse, options, sink, dout, grads));
  throw Error(
      Status::kNotCompiled,
      "flexcp attn: --device cuda: this build has no CUDA kernels (configured without CUDA)");
#endif
}

// Each output's folder exists and can be written to, checked before anything is computed (a
// long backward should not end on a typo in --dq).
void check_output_paths(const AttnArgs& a) {
  const std::pair<const char*, const std::string*> outputs[] = {
      {"out", &a.out}, {"lse", &a.lse}, {"dq", &a.dq},
      {"dk", &a.dk},   {"dv", &a.dv},   {"dsink", &a.dsink}};
  for (const auto& [name, file] : outputs) {
    if (file->empty()) continue;
    const std::filesystem::path path(*file);
    const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw Error(Status::kInvalidArgument, std::string("--") + name + " " + *file +
                                                ": the folder " + dir.string() + " does not exist");
    if (std::filesystem::is_directory(path, ec))
      throw Error(Status::kInvalidArgument,
                  std::string("--") + name + " " + *file + " is a folder, expected a .npy file");
    if (access(dir.c_str(), W_OK) != 0)
      throw Error(Status::kInvalidArgument, std::string("--") + name + " " + *file +
                                                ": the folder " + dir.string() +
                                                " is not writable");
  }
}

void run_attn(const AttnArgs& a) {
  check_output_paths(a);
  const DType dtype = parse_dtype(a.dtype);
  const Mask mask = build_mask(a.mask);
  HostTensor q = load(a.q, dtype, 3, "q"), k = load(a.k, dtype, 3, "k"),
             v = load(a.v, dtype, 3, "v");
  std::vector<std::int64_t> lse_shape = {q.shape()[0], q.shape()[1]};
  HostTensor out(dtype, q.shape()), lse(DType::kFloat32, lse_shape);
  out.poison();
  lse.poison();
  AttentionOptions options;
  options.scale = a.scale;
  options.softcap = a.softcap;
  options.deterministic = a.deterministic;
  std::optional<HostTensor> sink;
  if (!a.sink.empty()) {
    sink.emplace(load(a.sink, DType::kFloat32, 1, "sink"));
    options.sink = sink->view();
  }
  std::optional<HostTensor> dout;
  if (!a.dout.empty()) dout.emplace(load(a.dout, dtype, 3, "dout"));
  Grads grads(dtype, q, k, sink ? &*sink : nullptr);
  if (a.device == "cuda") {
    run_on_device(q, k, v, mask, out, lse, options, sink ? &*sink : nullptr,
                  dout ? &*dout : nullptr, &grads);
  } else {
    forward(q.view(), k.view(), v.view(), mask, out.view(), lse.view(), options);
    if (dout)
      backward(dout->view(), q.view(), k.view(), v.view(), out.view(), lse.view(), mask,
               grads.dq.view(), grads.dk.view(), grads.dv.view(), options,
               grads.dsink ? grads.dsink->view() : TensorView{});
  }
  save(a.out, out);
  save(a.lse, lse);
  if (!dout) return;
  save(a.dq, grads.dq);
  save(a.dk, grads.dk);
  save(a.dv, grads.dv);
  if (grads.dsink && !a.dsink.empty()) save(a.dsink, *grads.dsink);
}

}  // namespace

void add_attn_command(CLI::App& app) {
  auto args = std::make_shared<AttnArgs>();
  CLI::App* cmd = app.add_subcommand("attn", "Attention on saved tensors (.npy, float32)");
  add_mask_options(*cmd, args->mask);
  cmd->add_option("--q", args->q, "q [Tq, Hq, D]")->required()->check(CLI::ExistingFile);
  cmd->add_option("--k", args->k, "k [Tk, Hk, D]")->required()->check(CLI::ExistingFile);
  cmd->add_option("--v", args->v, "v [Tk, Hk, D]")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", args->out, "Output: out [Tq, Hq, D]")->required();
  cmd->add_option("--lse", args->lse, "Output: lse [Tq, Hq] (natural log)")->required();
  auto* dout = cmd->add_option("--dout", args->dout, "Gradient of out; runs the backward too")
                   ->check(CLI::ExistingFile);
  auto* dq = cmd->add_option("--dq", args->dq, "Output: dq");
  auto* dk = cmd->add_option("--dk", args->dk, "Output: dk");
  auto* dv = cmd->add_option("--dv", args->dv, "Output: dv");
  dout->needs(dq, dk, dv);
  dq->needs(dout);
  dk->needs(dout);
  dv->needs(dout);
  cmd->add_option("--sink", args->sink, "Per-head sink logits [Hq]")->check(CLI::ExistingFile);
  cmd->add_option("--dsink", args->dsink, "Output: gradient of the sink logits");
  cmd->add_option("--device", args->device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "Precision the inputs are rounded to and computed in")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  cmd->add_option("--scale", args->scale, "Logit scale (default 1/sqrt(D))");
  cmd->add_option("--softcap", args->softcap, "Logit softcap (0: none)");
  cmd->add_flag("--deterministic", args->deterministic,
                "Backward with dQ in a fixed order (bitwise repeatable; the CPU's always is)");
  cmd->callback([args] { run_attn(*args); });
}

}  // namespace flexcp::tools
