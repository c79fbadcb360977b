// The device presets, read from a data file: configs/devices.yaml as it was when this binary was built, compiled
// in (sim/embedded_data.h: a copied or installed binary never reads the source tree it was built from), or the
// file named by the environment variable SHARDSIM_DEVICES (same format; for a site's own list). Each entry holds the keys of a `device:` section (parsed by sim::load_device, the one device
// parser), the public source of every number or "assumption: ...", and facts the timing model does not use
// (on-chip memory, links, the node it comes in and the topology config that models it). Format: the header of
// configs/devices.yaml. `shardsim help devices` prints the list (apps/help.cpp); docs/DEVICES.md is that output.
//
// Errors: a missing, unreadable or malformed file, an entry without model:, a model key without a source, a
// name or alias given twice -> ConfigError "FILE:LINE: devices.NAME...: ..." (exit 2) at the first use of any
// preset. The file is read once per process.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sim/device_spec.h"

namespace shardsim::sim {

struct DevicePreset {
  std::string name;
  std::vector<std::string> aliases;  // accepted by device_preset(), not listed
  DeviceSpec spec;                   // as load_device reads the entry's model: section, name and sources set
  // (keys as written, e.g. "hbm_gbps, hbm_gib"; the source or "assumption: ..."), in file order.
  std::vector<std::pair<std::string, std::string>> sources;
  // (on_chip | links | node | node_config | kernel_table, text); kernel_table: published kernel measurements
  // (kernels/kernel_calibrate.h format), a path relative to the presets file's folder.
  std::vector<std::pair<std::string, std::string>> facts;
};

// Every preset, in file order. Thread-safe (read on first use).
const std::vector<DevicePreset>& device_presets();
// Where the presets are read from: $SHARDSIM_DEVICES, else "configs/devices.yaml (compiled in)".
std::string device_presets_file();
// A data file a preset names (a kernel_table fact: a path relative to the presets file's folder): read from beside
// $SHARDSIM_DEVICES when it is set, else the compiled-in copy. ConfigError (exit 2) naming it if there is none.
std::string preset_data_text(const std::string& relative, const char* what);
// Reads and checks a presets file (what device_presets() does once for device_presets_file(); for tests).
std::vector<DevicePreset> read_device_presets(const std::string& file);

}  // namespace shardsim::sim
