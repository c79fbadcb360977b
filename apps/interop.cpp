// `shardsim import hf|megatron|torchtitan SOURCE` (a shardsim config from a Hugging Face config.json, Megatron-LM
// launch arguments or a torchtitan job TOML) and `shardsim export megatron|torchtitan CONFIG` (the launch arguments or
// TOML of a config's plan). The libraries are interop/ (docs/IMPORT.md). Every rank parses (so every rank agrees on
// an error: one line, exit 2); rank 0 writes the output, to standard output or atomically to --output.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "common/error.h"
#include "common/output_file.h"
#include "common/text.h"
#include "interop/hf_config.h"
#include "interop/megatron.h"
#include "interop/torchtitan.h"

namespace shardsim::apps {

namespace {

struct ImportFlags {
  std::string kind, source, output, base, dtype, label;
  int64_t seq = 0, batch = 1, micro_batch = 0, world_size = 0, steps = 1, vocab = 0;
  std::string command;  // for the header
};

std::string command_line(const ImportFlags& f) {
  std::string s = "shardsim import " + f.kind + " " + (f.source.find('\n') == std::string::npos && f.source.size() < 200
                                                            ? f.source : std::string("'...'"));
  if (f.seq) s += " --seq " + std::to_string(f.seq);
  if (f.batch != 1) s += " --batch " + std::to_string(f.batch);
  if (f.micro_batch) s += " --micro-batch " + std::to_string(f.micro_batch);
  if (!f.dtype.empty()) s += " --dtype " + f.dtype;
  if (f.world_size) s += " --world-size " + std::to_string(f.world_size);
  if (f.steps != 1) s += " --steps " + std::to_string(f.steps);
  if (f.vocab) s += " --vocab " + std::to_string(f.vocab);
  if (!f.base.empty()) s += " --base " + f.base;
  return s;
}

// The config text, checked with the one parser. ConfigError when the written config would not load.
std::string run_import(const ImportFlags& f, std::string& summary) {
  interop::Imported imp;
  if (f.kind == "hf") {
    interop::HfOptions o{f.seq, f.batch, f.micro_batch, f.dtype, f.label};
    imp = interop::import_hf(f.source, o);
  } else {
    interop::LaunchOptions o{f.world_size, f.steps, f.vocab, f.label};
    imp = f.kind == "megatron" ? interop::import_megatron(f.source, o) : interop::import_torchtitan(f.source, o);
  }
  imp.command = command_line(f);
  const std::string out_dir = f.output.empty() ? "" : std::filesystem::path(f.output).parent_path().string();
  const interop::BaseConfig base = f.base.empty() ? interop::BaseConfig{} : interop::read_base(f.base, out_dir);
  const std::string yaml = interop::to_yaml(imp, base);
  interop::PlanSource parsed;
  try {
    parsed = interop::check_loads(yaml, f.output.empty() ? "the imported config" : f.output, imp.chips);
  } catch (const ConfigError& e) {
    const bool short_source = f.source.size() < 200 && f.source.find('\n') == std::string::npos;
    throw ConfigError(std::string("the config imported from ") + (short_source ? escape_control(f.source) : "the arguments") +
                      " does not load: " + e.what());
  }
  summary = "shardsim import: " + std::to_string(imp.keys.size()) + " keys written, " +
            std::to_string(imp.dropped.size()) + " source lines not expressed (listed in the header)" +
            (imp.moe.any() ? ", MoE fields recorded" : "") + "; " + std::to_string(interop::param_count(parsed.spec)) +
            " parameters as shardsim counts them; " + std::to_string(parsed.chips) + " chips";
  return yaml;
}

void emit(const runtime::World& world, const std::string& output, const std::string& text) {
  // Agreed, so a failed write is one line and exit 3 on every rank.
  world.agree([&] {
    if (world.rank() != 0) return;
    if (output.empty()) std::cout << text << std::flush;
    else write_file_atomic(output, text);
  });
}

}  // namespace

Command add_import(CLI::App& app, const runtime::World& world) {
  auto* cmd = app.add_subcommand("import", "write a shardsim training config from a Hugging Face config.json (hf), "
                                           "Megatron-LM launch arguments (megatron) or a torchtitan TOML (torchtitan); "
                                           "the header says which field became which key and which were not expressed "
                                           "(docs/IMPORT.md)");
  auto f = std::make_shared<ImportFlags>();
  cmd->add_option("kind", f->kind, "hf | megatron | torchtitan")->required()->check(CLI::IsMember({"hf", "megatron", "torchtitan"}));
  auto words = std::make_shared<std::vector<std::string>>();
  cmd->add_option("source", *words, "config.json | a launch script, or the arguments (one string, or after `--`) | job TOML")
      ->required()
      ->expected(1, 1 << 20);
  cmd->add_option("-o,--output", f->output, "write the config here (atomically); default: standard output");
  cmd->add_option("--base", f->base, "take device, topology, mode and the other root keys from this shardsim config");
  cmd->add_option("--seq", f->seq, "hf: tokens per sequence (default: min(max_position_embeddings, 4096))")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--batch", f->batch, "hf: global batch in sequences (default 1)")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--micro-batch", f->micro_batch, "hf: sequences per micro-batch")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--dtype", f->dtype, "hf: fp32 | bf16 (default: from torch_dtype)")->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--label", f->label, "model.model label");
  cmd->add_option("--world-size", f->world_size, "megatron, torchtitan: GPUs of the job (default: torchrun's flags)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--steps", f->steps, "megatron, torchtitan: train.steps written (default 1)")->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  cmd->add_option("--vocab", f->vocab, "megatron: the vocabulary size when only a tokenizer file names it")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  return {cmd, [&world, f, words]() -> int {
            // Megatron arguments given as words after `--`: one string again, each word with a space quoted.
            f->source = words->size() == 1 ? words->front() : std::string();
            for (size_t i = 0; words->size() > 1 && i < words->size(); ++i) {
              const std::string& w = (*words)[i];
              f->source += (i ? " " : "") + (w.find(' ') == std::string::npos ? w : "'" + w + "'");
            }
            if (words->size() > 1 && f->kind != "megatron")
              throw UsageError("import " + f->kind + ": one source file (got " + std::to_string(words->size()) + " words)");
            std::string yaml, summary;
            world.agree([&] {
              if (!f->output.empty()) check_outputs_distinct({{"--output", f->output}}, {{"source", f->source}});
              yaml = run_import(*f, summary);
            });
            emit(world, f->output, yaml);
            if (world.rank() == 0) std::fprintf(stderr, "%s\n", summary.c_str());
            return kExitOk;
          }};
}

Command add_export(CLI::App& app, const runtime::World& world) {
  auto* cmd = app.add_subcommand("export", "print the Megatron-LM launch arguments (megatron) or the torchtitan job TOML "
                                           "(torchtitan) of a shardsim training config's model and plan; what the "
                                           "target cannot express is listed as comments (docs/IMPORT.md)");
  auto kind = std::make_shared<std::string>(), config = std::make_shared<std::string>(), out = std::make_shared<std::string>();
  auto chips = std::make_shared<int64_t>(0);
  auto plan = std::make_shared<std::string>();
  auto set = std::make_shared<std::vector<std::string>>();
  cmd->add_option("kind", *kind, "megatron | torchtitan")->required()->check(CLI::IsMember({"megatron", "torchtitan"}));
  cmd->add_option("config", *config, "a shardsim training config")->required();
  cmd->add_option("-o,--output", *out, "write here (atomically); default: standard output");
  cmd->add_option("--world-size", *chips, "the job's chips when the config has neither a topology nor parallel.dp")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--plan", *plan, "replace the config's plan keys, as train --plan (e.g. a sweep winner's: tp=8,sp=true,dp=8)");
  cmd->add_option("--set", *set, "override a config key, as train --set (e.g. parallel.zero=1); repeatable");
  return {cmd, [&world, kind, config, out, chips, plan, set]() -> int {
            std::string text;
            world.agree([&] {
              if (!out->empty()) check_outputs_distinct({{"--output", *out}}, {{"config", *config}});
              const interop::PlanSource src = interop::load_plan_source(*config, *chips, *plan, *set);
              text = *kind == "megatron" ? interop::export_megatron(src) : interop::export_torchtitan(src);
            });
            emit(world, *out, text);
            return kExitOk;
          }};
}

std::string winner_exports(const std::string& kind, const experiments::SweepSpec& spec,
                           const std::vector<experiments::BestPlan>& best) {
  if (kind.empty()) return "";
  std::string out;
  for (const auto& b : best) {
    if (!b.train || b.best.empty() || !b.best.count("key")) continue;
    const auto p = std::find_if(spec.points.begin(), spec.points.end(),
                                [&](const experiments::SweepPoint& x) { return x.key == b.best.at("key"); });
    if (p == spec.points.end()) continue;
    out += "launch of the best plan " + escape_control(b.best.at("plan")) + " for " + escape_control(b.workload) +
           " on " + escape_control(b.topology) + " x " + escape_control(b.device) + " (export " + kind + "):\n";
    try {
      const interop::PlanSource src = interop::check_loads(p->config_yaml, p->origin, p->chips);
      out += kind == "megatron" ? interop::export_megatron(src) : interop::export_torchtitan(src);
    } catch (const Error& e) {
      out += "  not exported: " + escape_control(e.what()) + "\n";
    }
  }
  return out;
}

}  // namespace shardsim::apps
