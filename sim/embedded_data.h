// Data files compiled into the binary (sim/embed_data.cmake, at build time): configs/devices.yaml and the kernel
// tables it names (configs/kernel_tables/*.csv). A copied or installed binary reads these, never the source tree
// it was built from (issue 46 kind 8); the environment variable SHARDSIM_DEVICES names a site's own presets file
// instead (sim/device_presets.h).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace shardsim::sim {

struct EmbeddedFile {
  std::string_view path;  // relative to configs/: "devices.yaml", "kernel_tables/h100.csv"
  std::string_view text;  // the file's bytes as they were at build time
};

const std::vector<EmbeddedFile>& embedded_files();

// The compiled-in file at PATH (relative to configs/), or nullopt.
inline std::optional<std::string_view> embedded_file(std::string_view path) {
  for (const auto& f : embedded_files())
    if (f.path == path) return f.text;
  return std::nullopt;
}

}  // namespace shardsim::sim
