// `shardsim ckpt inspect FILE` and `shardsim ckpt convert IN OUT`: look into and rewrite HDF5 checkpoints
// (format in checkpoint/checkpoint.h). Both run on any number of ranks (mpirun -np 1 or N); each rank reads only
// its own slice of dim 0 of every tensor. A bad checkpoint fails every rank the same way: exit 2, one message
// from rank 0 naming the file and the tensor.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/commands.h"
#include "collectives/types.h"
#include "common/error.h"
#include "common/output_file.h"
#include "common/text.h"
#include "checkpoint/checkpoint.h"
#include "runtime/chips.h"

namespace shardsim::apps {

namespace {

struct CkptFlags {
  std::string file, json_path, dump;
  bool no_verify = false;
  std::string in, out, chunk = "auto", compression = "none";
};

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string layout(const checkpoint::TensorInfo& t) {
  std::string s = t.chunk.empty() ? "contiguous" : "chunk " + runtime::shape_str(t.chunk);
  if (t.gzip_level > 0) s += " gzip:" + std::to_string(t.gzip_level);
  return s;
}

std::string fixed(const std::string& s, size_t w) { return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' '); }

// Rank r's slice of dim 0 of a tensor of shape G: {offset, shape}.
std::pair<runtime::Shape, runtime::Shape> row_slice(const runtime::Shape& g, int rank, int size) {
  runtime::Shape off(g.size(), 0), shape = g;
  if (!g.empty()) {
    const collectives::Partition p{static_cast<size_t>(g[0]), static_cast<size_t>(size)};
    off[0] = static_cast<int64_t>(p.offset(static_cast<size_t>(rank)));
    shape[0] = static_cast<int64_t>(p.size(static_cast<size_t>(rank)));
  }
  return {off, shape};
}

int inspect(const runtime::World& world, const CkptFlags& f) {
  std::unique_ptr<checkpoint::CheckpointReader> rd;
  world.agree([&] {
    if (!f.json_path.empty()) check_outputs_distinct({{"--json", f.json_path}}, {{"the checkpoint", f.file}});
    rd = std::make_unique<checkpoint::CheckpointReader>(world, f.file);
  });
  const bool root = world.rank() == 0;

  if (!f.dump.empty()) {
    // The whole tensor on rank 0 (others read nothing), after its checksum is verified.
    runtime::Tensor t;
    world.agree([&] {
      const auto& info = rd->info(f.dump);
      if (!f.no_verify) rd->verify({f.dump});
      t = runtime::Tensor(info.dtype, root ? info.shape : runtime::Shape(info.shape.size(), 0));
      if (info.shape.empty() && !root) t = runtime::Tensor(info.dtype, runtime::Shape{});
      rd->read_block(f.dump, runtime::Shape(info.shape.size(), 0), t);
    });
    if (root) {
      const auto& info = rd->info(f.dump);
      std::ostringstream os;
      os << "{\"file\": " << nlohmann::json(f.file).dump() << ", \"name\": " << nlohmann::json(f.dump).dump()
         << ", \"dtype\": \"" << runtime::dtype_name(info.dtype) << "\", \"shape\": " << nlohmann::json(info.shape).dump()
         << ", \"checksum\": \"" << hex(info.checksum) << "\", \"values\": [";
      char buf[40];
      for (int64_t i = 0; i < t.numel(); ++i) {
        const double v = runtime::load_as_double(t.data(), static_cast<size_t>(i), t.dtype());
        std::snprintf(buf, sizeof buf, "%.17g", v);
        os << (i ? ", " : "") << buf;
      }
      os << "]}\n";
      std::cout << os.str() << std::flush;
    }
    return kExitOk;
  }

  // Verify tensor by tensor so the listing shows every tensor's verdict; errors are the same on every rank.
  std::vector<std::string> verdict;
  std::string first_error;
  for (const auto& t : rd->tensors()) {
    if (f.no_verify) {
      verdict.push_back("not checked");
      continue;
    }
    try {
      rd->verify({t.name});
      verdict.push_back("ok");
    } catch (const ConfigError& e) {
      verdict.push_back("MISMATCH");
      if (first_error.empty()) first_error = e.what();
    }
  }
  std::string json_text;
  if (root) {
    std::ostringstream os;
    const auto& tensors = rd->tensors();
    // Every name and attribute of the file is untrusted text: escaped (docs/SECURITY.md, promise 9).
    os << "checkpoint " << escape_control(f.file) << "\n";
    os << "  format     shardsim-checkpoint v1, step " << rd->step() << ", written by shardsim "
       << escape_control(rd->root_attribute("shardsim_version")) << "\n";
    if (!tensors.empty()) os << "  mesh       " << escape_control(tensors.front().mesh) << "\n";
    if (!rd->root_attribute("parallel_plan").empty())
      os << "  plan       " << escape_control(rd->root_attribute("parallel_plan")) << "\n";
    os << "  " << fixed("tensor", 22) << fixed("dtype", 7) << fixed("shape", 15) << fixed("sharding", 22)
       << fixed("layout", 26) << fixed("checksum", 20) << "verified\n";
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      os << "  " << fixed(escape_control(t.name), 22) << fixed(runtime::dtype_name(t.dtype), 7)
         << fixed(runtime::shape_str(t.shape), 15) << fixed(escape_control(t.sharding), 22) << fixed(layout(t), 26) << fixed(hex(t.checksum), 20) << verdict[i] << "\n";
    }
    size_t ok = 0;
    for (const auto& v : verdict) ok += v == "ok";
    const int k = runtime::chips_per_rank();  // several chips per rank: each rank's chip 0 reads for its chips
    if (!f.no_verify && k > 1)
      os << "checksums  " << ok << " of " << tensors.size() << " verified (read by " << world.size() / k << " rank"
         << (world.size() / k == 1 ? "" : "s") << " for " << world.size() << " chips)\n";
    else if (!f.no_verify)
      os << "checksums  " << ok << " of " << tensors.size() << " verified (read by " << world.size() << " rank"
         << (world.size() == 1 ? "" : "s") << ")\n";
    std::cout << escape_lines(os.str()) << std::flush;
    if (!f.json_path.empty()) {
      nlohmann::json j = {{"file", f.file}, {"step", rd->step()}, {"attributes", rd->root_attributes()}};
      j["tensors"] = nlohmann::json::array();
      for (size_t i = 0; i < tensors.size(); ++i) {
        const auto& t = tensors[i];
        j["tensors"].push_back({{"name", t.name}, {"dtype", runtime::dtype_name(t.dtype)}, {"shape", t.shape},
                                {"sharding", t.sharding}, {"mesh", t.mesh}, {"checksum", hex(t.checksum)},
                                {"chunk", t.chunk}, {"gzip", t.gzip_level}, {"storage_bytes", t.storage_bytes},
                                {"verified", verdict[i]}});
      }
      json_text = j.dump(2) + "\n";
    }
  }
  world.agree([&] {  // a failed write (e.g. a full disk): exit 3 on every rank, one line
    if (root && !f.json_path.empty()) write_file_atomic(f.json_path, json_text);
  });
  if (!first_error.empty()) throw AgreedError(first_error, kExitBadInput);
  return kExitOk;
}

int convert(const runtime::World& world, const CkptFlags& f) {
  checkpoint::SaveOptions so;
  world.agree([&] {
    so.chunking = checkpoint::parse_chunking(f.chunk);
    so.gzip_level = checkpoint::parse_compression(f.compression);
    if (so.gzip_level > 0 && so.chunking.kind == checkpoint::Chunking::Kind::contiguous)
      throw UsageError("--compression " + f.compression + " needs a chunked layout, not --chunk contiguous");
    try {
      (void)resolve_file_output(f.out, "ckpt convert: OUT");  // HDF5 seeks: never a stream
      check_outputs_distinct({{"ckpt convert: OUT", f.out}}, {{"IN", f.in}});
    } catch (const UsageError& e) {
      if (std::string(e.what()).find("would overwrite IN") != std::string::npos)
        throw UsageError("ckpt convert: IN and OUT are the same file (" + f.out + ")");
      throw;
    }
  });
  std::unique_ptr<checkpoint::CheckpointReader> rd;
  world.agree([&] { rd = std::make_unique<checkpoint::CheckpointReader>(world, f.in); });
  // Each rank holds its dim-0 slice of every tensor (memory: the checkpoint / ranks).
  std::vector<runtime::Tensor> blocks;
  blocks.reserve(rd->tensors().size());
  std::vector<checkpoint::CheckpointEntry> entries;
  world.agree([&] {
    // --chunk DxD...: one chunk shape for every tensor, so each tensor must have that many dimensions
    // (scalars and empty tensors are stored contiguous whatever --chunk says).
    if (so.chunking.kind == checkpoint::Chunking::Kind::dims)
      for (const auto& t : rd->tensors())
        if (!t.shape.empty() && runtime::shape_numel(t.shape) > 0 && t.shape.size() != so.chunking.dims.size())
          throw UsageError("ckpt convert: --chunk " + f.chunk + " has " + std::to_string(so.chunking.dims.size()) +
                           " dimensions but tensor '" + t.name + "' of " + f.in + " has " +
                           std::to_string(t.shape.size()) + " (shape " + runtime::shape_str(t.shape) +
                           "); use a byte size (e.g. --chunk 1M) for tensors of different ranks");
    // HDF5 keeps an index entry (and while writing a cache slot) per chunk: `--chunk 1` on a 135 MB checkpoint ran
    // a minute and took GBs before HDF5 failed. At most 2^20 chunks per tensor, refused before anything is written.
    constexpr double kMaxChunks = 1 << 20;
    for (const auto& t : rd->tensors()) {
      const double n = double(runtime::shape_numel(t.shape));
      if (t.shape.empty() || n == 0 || (so.chunking.kind != checkpoint::Chunking::Kind::bytes &&
                                        so.chunking.kind != checkpoint::Chunking::Kind::dims))
        continue;
      double per_chunk = 1;  // elements
      if (so.chunking.kind == checkpoint::Chunking::Kind::dims)
        for (size_t d = 0; d < t.shape.size(); ++d)
          per_chunk *= double(std::clamp<int64_t>(so.chunking.dims[d], 1, t.shape[d]));
      else
        per_chunk = std::max(1.0, double(so.chunking.bytes) / double(runtime::dtype_size(t.dtype)));
      if (n / per_chunk > kMaxChunks)
        throw UsageError("ckpt convert: --chunk " + f.chunk + " cuts tensor '" + t.name + "' (" +
                         runtime::shape_str(t.shape) + ") into about " + std::to_string(int64_t(n / per_chunk)) +
                         " chunks; at most 1048576 per tensor (HDF5 keeps an index entry per chunk): use larger chunks");
    }
    for (const auto& t : rd->tensors()) {
      auto [off, shape] = row_slice(t.shape, world.rank(), world.size());
      blocks.emplace_back(t.dtype, shape);
      // Read once, checksum verified from the row slices just read: corrupted data is never copied into a file
      // with fresh checksums.
      rd->read_block_verified(t.name, off, blocks.back(), !t.shape.empty() || world.rank() == 0);
      // A rank-0 tensor: every rank read it, rank 0 writes it.
      entries.push_back({t.name, &blocks.back(), t.shape, off, t.sharding, !t.shape.empty() || world.rank() == 0});
    }
  });
  so.step = rd->step();
  if (!rd->tensors().empty()) so.mesh = rd->tensors().front().mesh;
  const auto attrs = rd->root_attributes();
  uint64_t before = 0;
  for (const auto& t : rd->tensors()) before += t.storage_bytes;
  const size_t n = rd->tensors().size();
  rd.reset();
  world.agree([&] { checkpoint::save_checkpoint(world, f.out, entries, attrs, so); });
  // Report what landed (and check it opens).
  world.agree([&] { rd = std::make_unique<checkpoint::CheckpointReader>(world, f.out); });
  uint64_t after = 0;
  for (const auto& t : rd->tensors()) after += t.storage_bytes;
  if (world.rank() == 0)
    std::printf("converted %s -> %s: %zu tensors, %llu -> %llu bytes of data on disk (chunk %s, compression %s)\n",
                escape_control(f.in).c_str(), escape_control(f.out).c_str(), n, static_cast<unsigned long long>(before),
                static_cast<unsigned long long>(after), escape_control(f.chunk).c_str(),
                escape_control(f.compression).c_str());
  return kExitOk;
}

}  // namespace

Command add_ckpt(CLI::App& app, const runtime::World& world) {
  auto flags = std::make_shared<CkptFlags>();
  auto* sub = app.add_subcommand("ckpt", "inspect or convert HDF5 checkpoints (any number of ranks)");
  sub->require_subcommand(1);
  auto* ins = sub->add_subcommand("inspect", "list tensors, shapes, dtypes, shardings; verify every checksum");
  ins->add_option("file", flags->file, "checkpoint (.h5)")->required();
  ins->add_option("--json", flags->json_path, "also write the listing as JSON to this file");
  ins->add_option("--dump", flags->dump, "print one tensor (verified) as JSON: shape, dtype, checksum, values");
  ins->add_flag("--no-verify", flags->no_verify, "do not read the data to verify checksums");
  auto* conv = sub->add_subcommand("convert", "rewrite a checkpoint with another chunking / compression");
  conv->add_option("in", flags->in, "checkpoint to read")->required();
  conv->add_option("out", flags->out, "checkpoint to write (atomically, like every save)")->required();
  conv->add_option("--chunk", flags->chunk, "auto | contiguous | bytes per chunk (1M) | dims (64x128)");
  conv->add_option("--compression", flags->compression, "none | gzip | gzip:N (N = 1..9)");
  return {sub, [&world, flags, ins, conv]() -> int {
            if (ins->parsed()) return inspect(world, *flags);
            if (conv->parsed()) return convert(world, *flags);
            return kExitBadInput;
          }};
}

}  // namespace shardsim::apps
